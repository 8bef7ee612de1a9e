"""Sampling and logits-processor fields at the limits of what MLX and mlx-lm take:
``logit_bias`` token ids and value types, ``seed``, ``top_k``, the penalty
windows, ``xtc_threshold``, and logprobs that stay finite JSON at the
document's extremes.

Each case is a request that fuzzing (``python -m mlxspec.conformance fuzz``) or
the parity run sent and the server answered with a 500, a crash or a body that
is not JSON. A value that cannot work is a 400 naming the field; a value whose
meaning is obvious (``top_k`` at least the vocabulary size is "off", a penalty
window longer than any sequence is "all of it") is accepted. The ``client``
fixture checks every response against the OpenAPI document.
"""

from __future__ import annotations

import json
import math

import httpx
import pytest

from mlxspec.engine import GenerationDefaults, ModelInfo
from mlxspec.errors import ApiError
from mlxspec.handlers.requests import to_generation_request

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
TINY_VOCAB = 264  # fixtures/tiny_model.py: 3 special + 256 byte tokens + 5 merges
INFO = ModelInfo(id="m", context_window=256, created=0, vocab_size=TINY_VOCAB)


def completion(client: httpx.Client, **fields: object) -> httpx.Response:
    return client.post(COMP, json={"prompt": "hello", "max_tokens": 2, **fields})


def chat(client: httpx.Client, **fields: object) -> httpx.Response:
    messages = fields.pop("messages", [{"role": "user", "content": "hi"}])
    return client.post(CHAT, json={"messages": messages, "max_tokens": 2, **fields})


def assert_400(r: httpx.Response, param: str | None) -> str:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    return err["message"]


def strict_json(text: str) -> object:
    """Parse as RFC 8259 JSON: ``NaN``/``Infinity`` are not JSON."""

    def reject(name: str) -> None:
        raise AssertionError(f"{name} in a response body")

    return json.loads(text, parse_constant=reject)


# --- logit_bias: mlx's at[].add with an out-of-range id corrupts memory -------
# (the whole server process died, with no response and no log line)


@pytest.mark.parametrize("key", [str(TINY_VOCAB), "99999999", "-1", str(2**64)])
def test_logit_bias_id_outside_vocabulary_is_400(client: httpx.Client, key: str) -> None:
    message = assert_400(completion(client, logit_bias={key: 1.0}), "logit_bias")
    assert key in message
    assert completion(client).status_code == 200  # still alive


def test_logit_bias_last_id_in_vocabulary_is_accepted(client: httpx.Client) -> None:
    assert completion(client, logit_bias={str(TINY_VOCAB - 1): 5}).status_code == 200


def test_logit_bias_ids_checked_in_conversion() -> None:
    with pytest.raises(ApiError) as err:
        to_generation_request({"logit_bias": {"300": 1}}, [1], GenerationDefaults(), INFO)
    assert (err.value.status, err.value.param) == (400, "logit_bias")
    req = to_generation_request({"logit_bias": {"263": 1}}, [1], GenerationDefaults(), INFO)
    assert req.logits.logit_bias == ((263, 1.0),)


@pytest.mark.parametrize(
    ("route", "field", "bias", "message"),
    [
        (
            "/v1/chat/completions",
            "messages",
            {"5": "x"},
            "logit_bias must be a dict of int to float",
        ),
        ("/v1/completions", "prompt", {"5": None}, "logit_bias must be a dict of int to float"),
        ("/v1/chat/completions", "messages", [1, 2], "logit_bias must be of type dict"),
        ("/v1/completions", "prompt", "7042", "logit_bias must be of type dict"),
    ],
)
def test_logit_bias_type_errors_use_mlx_lm_messages(
    client: httpx.Client, route: str, field: str, bias: object, message: str
) -> None:
    # mlx_lm.server's _validate / float() coercion messages (err_logit_bias_* cases of
    # the parity run, tests/real/test_parity.py)
    value = [{"role": "user", "content": "Hi"}] if field == "messages" else "Hi"
    r = client.post(route, json={field: value, "max_tokens": 1, "logit_bias": bias})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == message
    assert r.json()["error"]["param"].startswith("logit_bias")


# --- seed: mx.random.seed takes an unsigned 64-bit integer --------------------


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_seed_outside_uint64_is_400(client: httpx.Client, seed: int) -> None:
    assert_400(completion(client, seed=seed), "seed")


@pytest.mark.parametrize("seed", [0, 2**64 - 1])
def test_seed_uint64_bounds_are_accepted(client: httpx.Client, seed: int) -> None:
    assert completion(client, seed=seed).status_code == 200


# --- top_k: mlx-lm's sampler raises for k >= vocabulary size ------------------


@pytest.mark.parametrize("top_k", [TINY_VOCAB, 10**6, 2**63])
def test_top_k_at_least_vocabulary_means_off(client: httpx.Client, top_k: int) -> None:
    r = completion(client, top_k=top_k, temperature=1.0, seed=7)
    assert r.status_code == 200, r.text
    off = completion(client, top_k=0, temperature=1.0, seed=7).json()["choices"][0]["text"]
    assert r.json()["choices"][0]["text"] == off
    assert completion(client, top_k=top_k, temperature=1.0).status_code == 200  # batched lane


def test_top_k_clamped_in_conversion() -> None:
    convert = to_generation_request
    assert convert({"top_k": TINY_VOCAB}, [1], GenerationDefaults(), INFO).sampling.top_k == 0
    assert convert({"top_k": 263}, [1], GenerationDefaults(), INFO).sampling.top_k == 263


# --- penalty windows: mlx slices need 32-bit indices --------------------------


@pytest.mark.parametrize(
    "field,penalty",
    [
        ("repetition_context_size", "repetition_penalty"),
        ("presence_context_size", "presence_penalty"),
        ("frequency_context_size", "frequency_penalty"),
    ],
)
def test_huge_penalty_window_is_the_whole_sequence(
    client: httpx.Client, field: str, penalty: str
) -> None:
    r = completion(client, **{field: 2**40, penalty: 1.5, "temperature": 0})
    assert r.status_code == 200, r.text
    whole = completion(client, **{field: 10_000, penalty: 1.5, "temperature": 0})
    assert r.json()["choices"][0]["text"] == whole.json()["choices"][0]["text"]


# --- xtc_threshold: mlx-lm's XTC raises above 0.5, where XTC cannot act -------


def test_xtc_threshold_above_half_is_accepted(client: httpx.Client) -> None:
    r = completion(client, xtc_probability=1.0, xtc_threshold=1.0, temperature=1.0, seed=3)
    assert r.status_code == 200, r.text
    off = completion(client, temperature=1.0, seed=3).json()["choices"][0]["text"]
    assert r.json()["choices"][0]["text"] == off


# --- logprobs: float32 overflow gave NaN / -Infinity, which is not JSON -------


@pytest.mark.parametrize(
    "fields",
    [
        # The document's extremes (tests/api/test_float_ranges.py: beyond them is a 400).
        {"frequency_penalty": -2},
        {"repetition_penalty": 0.01},
        {"logit_bias": {"5": 1e10}},
        {"logit_bias": {"5": 1e10, "6": 1e10}, "top_logprobs": 3},
        {"logit_bias": {"5": -1e10}, "top_logprobs": 3},
        {"presence_penalty": 2, "temperature": 1e308},
    ],
)
def test_logprobs_are_always_finite_json(client: httpx.Client, fields: dict) -> None:
    r = completion(client, logprobs=True, **fields)
    assert r.status_code == 200, r.text
    body = strict_json(r.text)
    for entry in body["choices"][0]["logprobs"]["content"]:
        values = [entry["logprob"]] + [t["logprob"] for t in entry.get("top_logprobs", [])]
        assert all(math.isfinite(v) and v <= 0 for v in values), entry

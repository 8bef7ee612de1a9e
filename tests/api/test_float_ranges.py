"""Float fields whose extreme (but finite) JSON values overflow float32 in MLX.

Logits-processor values (``logit_bias``, the three penalties) get ranges in
the document: outside them a request is a 400 naming the field, in each
surface's error shape. Sampler values whose extremes have a clear meaning
(a huge ``temperature`` is uniform sampling, a tiny positive ``top_p`` keeps
only the most likely token) are accepted and sampled with that meaning.
The ``client`` fixture checks every response against the document.
"""

from __future__ import annotations

import httpx
import pytest

from mlxspec.engine import SamplingParams
from mlxspec.engine.sampling.sampler import MAX_TEMPERATURE, build_sampler

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
RESP = "/v1/responses"
MSGS = "/v1/messages"

REP = "repetition_penalty must be 0 (off) or between 0.01 and 100"
PRES = "presence_penalty must be between -2 and 2"
FREQ = "frequency_penalty must be between -2 and 2"
BIAS = "logit_bias.5 must be between -1e10 and 1e10"

#: (field, value, param, message): one out-of-range value per rule.
REJECTED = [
    ("logit_bias", {"5": 1e308}, "logit_bias.5", BIAS),
    ("logit_bias", {"5": -1e308}, "logit_bias.5", BIAS),
    ("logit_bias", {"5": 10000000001}, "logit_bias.5", BIAS),
    ("presence_penalty", -1e308, "presence_penalty", PRES),
    ("presence_penalty", 2.01, "presence_penalty", PRES),
    ("frequency_penalty", -1e308, "frequency_penalty", FREQ),
    ("frequency_penalty", 3, "frequency_penalty", FREQ),
    ("repetition_penalty", 1e-320, "repetition_penalty", REP),
    ("repetition_penalty", 0.009, "repetition_penalty", REP),
    ("repetition_penalty", 1e39, "repetition_penalty", REP),
    ("repetition_penalty", -1, "repetition_penalty", REP),
]

#: Boundary values and what clients commonly send: all accepted.
ACCEPTED = [
    {"logit_bias": {"5": -100, "6": 100}},
    {"logit_bias": {"2": -1e9}},
    {"logit_bias": {"5": 1e10, "6": -1e10}},
    {"presence_penalty": 2, "frequency_penalty": -2},
    {"presence_penalty": -2, "frequency_penalty": 2},
    {"repetition_penalty": 1.1},
    {"repetition_penalty": 0},
    {"repetition_penalty": 0.01},
    {"repetition_penalty": 100},
    {"repetition_penalty": None, "presence_penalty": None, "logit_bias": None},
]


def _openai_error(param: str, message: str) -> dict:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    }


@pytest.mark.parametrize("field,value,param,message", REJECTED)
@pytest.mark.parametrize(
    "path,base",
    [
        (CHAT, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}),
        (COMP, {"prompt": "hi", "max_tokens": 2}),
        (RESP, {"input": "hi", "max_output_tokens": 2}),
    ],
)
def test_openai_surfaces_reject_out_of_range_floats(
    client: httpx.Client, path: str, base: dict, field: str, value: object, param: str, message: str
) -> None:
    r = client.post(path, json={**base, field: value})
    assert r.status_code == 400, r.text
    assert r.json() == _openai_error(param, message)


@pytest.mark.parametrize("field,value,param,message", [c for c in REJECTED if c[0] != "logit_bias"])
def test_messages_rejects_out_of_range_penalties(
    client: httpx.Client, field: str, value: object, param: str, message: str
) -> None:
    body = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}], field: value}
    r = client.post(MSGS, json=body)
    assert r.status_code == 400, r.text
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }


def test_messages_ignores_logit_bias_of_any_size(client: httpx.Client) -> None:
    # The Anthropic protocol has no logit_bias (the reference): not validated, not used.
    body = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    r = client.post(MSGS, json={**body, "logit_bias": {"5": 1e308}})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("fields", ACCEPTED)
def test_in_range_values_generate(client: httpx.Client, fields: dict) -> None:
    r = client.post(COMP, json={"prompt": "hello", "max_tokens": 2, "logprobs": True, **fields})
    assert r.status_code == 200, r.text
    logprobs = [e["logprob"] for e in r.json()["choices"][0]["logprobs"]["content"]]
    assert len(logprobs) == 2 and all(-1e11 < v <= 0 for v in logprobs), logprobs


def _text(client: httpx.Client, **fields: object) -> str:
    body = {"prompt": "hello there", "max_tokens": 6, "logit_bias": {"2": -1e9}, **fields}
    r = client.post(COMP, json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.mark.parametrize("top_p", [1e-320, 1e-46, 1e-9])
def test_tiny_top_p_keeps_only_the_most_likely_token(client: httpx.Client, top_p: float) -> None:
    # mlx-lm's apply_top_p dropped every token once top_p rounds to 0 in float32.
    greedy = _text(client, temperature=0)
    assert _text(client, temperature=1.0, top_p=top_p, seed=5) == greedy


@pytest.mark.parametrize("temperature", [1e46, 1e308])
def test_huge_temperature_samples_like_the_ceiling(
    client: httpx.Client, temperature: float
) -> None:
    # With top_k, 1 / temperature rounding to 0 turned masked logits into NaN.
    same = _text(client, temperature=MAX_TEMPERATURE, top_k=5, seed=9)
    assert _text(client, temperature=temperature, top_k=5, seed=9) == same
    assert len(set(_text(client, temperature=temperature, top_k=5, seed=s) for s in range(4))) > 1


def test_sampler_bounds_are_applied() -> None:
    import mlx.core as mx

    logprobs = mx.log(mx.softmax(mx.array([[1.0, 2.0, 3.0, 0.5]]), axis=-1))
    tiny = build_sampler(SamplingParams(temperature=1.0, top_p=1e-320, seed=0), [])
    assert {tiny(logprobs).item() for _ in range(20)} == {2}
    hot = build_sampler(SamplingParams(temperature=1e308, top_k=2, seed=0), [])
    assert {hot(logprobs).item() for _ in range(40)} == {1, 2}

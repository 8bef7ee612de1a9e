"""``top_p: 0`` is "off", as the reference says (``"top_p": 0, ... // 0 = off``).

mlx-lm's sampler agrees (it filters only for 0 < top_p < 1); vLLM and
llama.cpp instead read 0 as "most likely token only". The document's
description says which, and points such clients to ``temperature: 0`` or a
tiny ``top_p``, which (clamped to 1e-7) keeps only the most likely token.
Exact values on the tiny model, over several seeds.
"""

from __future__ import annotations

import httpx
import pytest

from mlxspec.engine import SamplingParams
from mlxspec.engine.sampling.sampler import build_sampler
from mlxspec.openapi import load_spec

COMP, CHAT = "/v1/completions", "/v1/chat/completions"
SEEDS = range(6)
#: Hot enough that the tiny model's peaked distribution really samples (at
#: temperature 1 it nearly always picks the argmax, which would prove nothing).
HOT = 5.0
#: EOS banned so every run has the same length (the tiny model's <|im_end|> is 2).
BODY = {"prompt": "hello there", "max_tokens": 8, "logit_bias": {"2": -1e9}, "logprobs": True}


def _ids(client: httpx.Client, path: str = COMP, **fields: object) -> tuple[int, ...]:
    """The generated token ids (from mlx-lm's logprobs block: exact, unlike text)."""
    body = {**BODY, **fields}
    if path == CHAT:
        body = {k: v for k, v in body.items() if k != "prompt"}
        body["messages"] = [{"role": "user", "content": "hello there"}]
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return tuple(e["id"] for e in r.json()["choices"][0]["logprobs"]["content"])


def test_top_p_zero_samples_like_no_top_p(client: httpx.Client) -> None:
    runs = []
    for seed in SEEDS:
        off = _ids(client, temperature=HOT, seed=seed)
        assert _ids(client, temperature=HOT, top_p=0, seed=seed) == off, seed
        assert _ids(client, temperature=HOT, top_p=1, seed=seed) == off, seed
        runs.append(off)
    assert len(set(runs)) == len(runs)  # the seeds really sample differently


def test_top_p_zero_is_not_greedy(client: httpx.Client) -> None:
    greedy = _ids(client, temperature=0)
    assert len(greedy) == 8
    for seed in SEEDS:
        assert _ids(client, temperature=HOT, top_p=0, seed=seed) != greedy, seed


@pytest.mark.parametrize("top_p", [1e-7, 1e-9])
def test_tiny_top_p_is_greedy_over_seeds(client: httpx.Client, top_p: float) -> None:
    greedy = _ids(client, temperature=0)
    for seed in SEEDS:
        assert _ids(client, temperature=HOT, top_p=top_p, seed=seed) == greedy, seed


def test_chat_top_p_zero_matches_no_top_p(client: httpx.Client) -> None:
    for seed in (3, 4):
        off = _ids(client, CHAT, temperature=HOT, seed=seed)
        assert _ids(client, CHAT, temperature=HOT, top_p=0, seed=seed) == off, seed
        assert off != _ids(client, CHAT, temperature=0), seed


def test_sampler_top_p_zero_draws_as_off() -> None:
    import mlx.core as mx

    logprobs = mx.log(mx.softmax(mx.array([[1.0, 2.0, 3.0, 0.5]]), axis=-1))

    def draws(top_p: float) -> list[int]:
        mx.random.seed(11)
        sampler = build_sampler(SamplingParams(temperature=1.0, top_p=top_p), [])
        return [sampler(logprobs).item() for _ in range(30)]

    assert draws(0.0) == draws(1.0)
    assert set(draws(0.0)) == {0, 1, 2, 3}
    assert draws(1e-9) == [2] * 30


def test_document_says_what_top_p_zero_means() -> None:
    schemas = load_spec()["components"]["schemas"]
    text = " ".join(schemas["GenerationParameters"]["properties"]["top_p"]["description"].split())
    assert text.startswith("Nucleus sampling mass. 0 (or 1) is off: every token is kept")
    assert "send `temperature: 0`" in text

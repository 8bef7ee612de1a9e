"""The body -> engine request conversion and the sampling-default precedence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxspec.engine import GenerationDefaults
from mlxspec.engine.sampling.sampler import read_generation_config
from mlxspec.errors import ApiError
from mlxspec.handlers.requests import to_generation_request

PROMPT = [1, 2, 3]


def test_mlx_lm_defaults_when_nothing_is_set() -> None:
    req = to_generation_request({}, PROMPT, GenerationDefaults())
    s, lg = req.sampling, req.logits
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.seed) == (0.0, 1.0, 0, 0.0, None)
    assert (s.xtc_probability, s.xtc_threshold) == (0.0, 0.1)
    assert (lg.repetition_penalty, lg.repetition_context_size, lg.logit_bias) == (0.0, 20, ())
    assert (req.max_tokens, req.stop, req.logprobs, req.top_logprobs) == (None, (), False, 0)
    assert req.prompt == (1, 2, 3)


def test_request_values_win_over_defaults_and_nulls_fall_back() -> None:
    defaults = GenerationDefaults(temperature=0.6, top_p=0.9, top_k=40, max_tokens=64)
    req = to_generation_request({"temperature": 0.2, "top_k": None}, PROMPT, defaults)
    assert (req.sampling.temperature, req.sampling.top_p, req.sampling.top_k) == (0.2, 0.9, 40)
    assert req.max_tokens == 64


def test_max_completion_tokens_wins_and_stop_forms() -> None:
    d = GenerationDefaults()
    assert (
        to_generation_request({"max_tokens": 9, "max_completion_tokens": 3}, PROMPT, d).max_tokens
        == 3
    )
    assert (
        to_generation_request(
            {"max_tokens": 9, "max_completion_tokens": None}, PROMPT, d
        ).max_tokens
        == 9
    )
    assert to_generation_request({"stop": "x"}, PROMPT, d).stop == ("x",)
    assert to_generation_request({"stop": ["a", "b"]}, PROMPT, d).stop == ("a", "b")
    assert to_generation_request({"stop": None}, PROMPT, d).stop == ()


def test_penalties_logprobs_and_bias() -> None:
    body = {
        "repetition_penalty": 1.1,
        "repetition_context_size": 5,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "frequency_context_size": 0,
        "logit_bias": {"42": -5, "7": 2.5},
        "logprobs": True,
        "top_logprobs": -1,
        "seed": 3,
        "xtc_probability": 0.5,
    }
    req = to_generation_request(body, PROMPT, GenerationDefaults())
    lg = req.logits
    assert (lg.repetition_penalty, lg.repetition_context_size) == (1.1, 5)
    assert (lg.presence_penalty, lg.frequency_penalty, lg.frequency_context_size) == (0.5, -0.5, 0)
    assert lg.logit_bias == ((42, -5.0), (7, 2.5))
    assert (req.logprobs, req.top_logprobs, req.sampling.seed) == (True, 0, 3)
    assert req.sampling.xtc_probability == 0.5


def test_non_integer_logit_bias_key() -> None:
    with pytest.raises(ApiError) as err:
        to_generation_request({"logit_bias": {"abc": 1}}, PROMPT, GenerationDefaults())
    assert (err.value.message, err.value.param) == (
        "logit_bias must be a dict of int to float",
        "logit_bias",
    )


def test_generation_config_and_cli_precedence(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.7, "top_p": 0.95, "top_k": 20, "do_sample": True})
    )
    model = read_generation_config(tmp_path)
    assert (model.temperature, model.top_p, model.top_k) == (0.7, 0.95, 20)
    merged = model.merged(temperature=0.1, top_p=None, max_tokens=128)
    assert (merged.temperature, merged.top_p, merged.top_k, merged.max_tokens) == (
        0.1,
        0.95,
        20,
        128,
    )


def test_generation_config_do_sample_false_is_greedy(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        json.dumps({"temperature": 0.7, "do_sample": False})
    )
    assert read_generation_config(tmp_path).temperature == 0.0


@pytest.mark.parametrize("content", ["not json", "[1]", ""])
def test_generation_config_unreadable_or_absent(tmp_path: Path, content: str) -> None:
    if content:
        (tmp_path / "generation_config.json").write_text(content)
    assert read_generation_config(tmp_path) == GenerationDefaults()

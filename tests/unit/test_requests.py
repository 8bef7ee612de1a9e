"""``handlers.requests``: the pure body -> engine requests conversion (choices,
sessions, limits of the model the document cannot state)."""

from __future__ import annotations

import pytest

from mlxspec.engine import Constraint, GenerationDefaults, ModelInfo
from mlxspec.errors import ApiError
from mlxspec.handlers.requests import (
    MAX_PENALTY_WINDOW,
    choice_count,
    choice_requests,
    session_key,
    to_generation_request,
)

PROMPT = [5, 6, 7]
MODEL = ModelInfo(id="m", context_window=4096, created=0, vocab_size=266)


def convert(body: dict, model: ModelInfo | None = MODEL, session: str | None = None):
    return to_generation_request(body, PROMPT, GenerationDefaults(), model, session)


@pytest.mark.parametrize(("body", "n"), [({}, 1), ({"n": None}, 1), ({"n": 1}, 1), ({"n": 4}, 4)])
def test_choice_count(body: dict, n: int) -> None:
    assert choice_count(body) == n


def test_choice_requests_shift_the_seed_per_choice() -> None:
    first = convert({"n": 3, "seed": 2**64 - 2})
    requests = choice_requests(first, 3)
    assert requests[0] is first
    assert [r.sampling.seed for r in requests] == [2**64 - 2, 2**64 - 1, 0]
    assert all(r.shared_prefill for r in requests)
    assert {r.prompt for r in requests} == {(5, 6, 7)}


def test_unseeded_choices_are_one_request() -> None:
    first = convert({"n": 2})
    assert choice_requests(first, 2) == [first, first]
    assert choice_requests(convert({}), 1) == [convert({})]
    assert not convert({}).shared_prefill


@pytest.mark.parametrize(
    ("body", "headers", "session"),
    [
        ({"session_id": "a", "prompt_cache_key": "b"}, {"x-session-affinity": "c"}, "a"),
        ({"prompt_cache_key": "b"}, {"x-session-affinity": "c", "session_id": "d"}, "b"),
        ({"session_id": ""}, {"x-session-affinity": "c", "session_id": "d"}, "c"),
        ({}, {"session_id": "d"}, "d"),
        ({"session_id": 7}, {}, None),
        ({}, {}, None),
    ],
)
def test_session_key_precedence(body: dict, headers: dict, session: str | None) -> None:
    assert session_key(body, headers) == session


def test_the_session_and_the_open_final_message_reach_the_request() -> None:
    req = convert({"chat_template_kwargs": {"continue_final_message": True}}, session="s1")
    assert (req.session, req.continuation) == ("s1", True)
    assert not convert({"chat_template_kwargs": {}}).continuation


def test_limits_of_the_model_and_of_mlx() -> None:
    req = convert({"top_k": 266, "xtc_threshold": 0.9, "repetition_context_size": 2**40})
    assert req.sampling.top_k == 0  # the whole vocabulary: off
    assert req.sampling.xtc_threshold == 0.5
    assert req.logits.repetition_context_size == MAX_PENALTY_WINDOW
    assert convert({"top_k": 265}).sampling.top_k == 265
    assert convert({"top_k": 266}, model=None).sampling.top_k == 266


@pytest.mark.parametrize(
    ("bias", "message"),
    [
        ({"266": 1}, "logit_bias key 266 is not a token id of this model (token ids are 0 to 265)"),
        ({"-1": 1}, "logit_bias key -1 is not a token id of this model (token ids are 0 to 265)"),
    ],
)
def test_logit_bias_outside_the_vocabulary(bias: dict, message: str) -> None:
    with pytest.raises(ApiError) as err:
        convert({"logit_bias": bias})
    assert (err.value.kind, err.value.message, err.value.param) == (
        "invalid_request",
        message,
        "logit_bias",
    )


@pytest.mark.parametrize(
    ("body", "logprobs", "top"),
    [
        ({"logprobs": 3}, True, 3),
        ({"logprobs": 0}, True, 0),
        ({"logprobs": 3, "top_logprobs": 1}, True, 1),
        ({"logprobs": True, "top_logprobs": 5}, True, 5),
        ({"logprobs": False, "top_logprobs": None}, False, 0),
    ],
)
def test_legacy_integer_logprobs(body: dict, logprobs: bool, top: int) -> None:
    req = convert(body)
    assert (req.logprobs, req.top_logprobs) == (logprobs, top)


def test_the_structured_output_constraint_rides_the_request() -> None:
    body = {"response_format": {"type": "json_schema", "json_schema": {"schema": {"a": 1}}}}
    assert convert(body).constraint == Constraint("json_schema", '{"a": 1}')
    assert convert({"guided_regex": "[0-9]+"}).constraint == Constraint("regex", "[0-9]+")
    assert convert({"response_format": {"type": "text"}}).constraint is None

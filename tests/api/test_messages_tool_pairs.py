"""Anthropic tool results must answer the tool uses of the turn just before
them, all of them, ahead of anything else in their turn (Anthropic's "Tool use"
and "Parallel tool use" rules, which its API enforces with a 400): a result for
an unknown id, a call left unanswered by the next turn (results split over two
user turns too), or a result after text, is a 400 in Anthropic's envelope
naming the message, on ``/v1/messages`` and ``/v1/messages/count_tokens``
alike. Text after the results is fine. A conversation may end on the call."""

from __future__ import annotations

import httpx
import pytest

from mlxspec.errors import ApiError
from mlxspec.handlers.messages.anthropic import check_tool_pairs


def use(call_id: str) -> dict:
    return {"type": "tool_use", "id": call_id, "name": "clock", "input": {}}


def result(call_id: str) -> dict:
    return {"type": "tool_result", "tool_use_id": call_id, "content": "12:00"}


ASK = {"role": "user", "content": "What time is it?"}
TEXT = {"type": "text", "text": "Here you go."}
IMAGE = {"type": "image", "source": {"type": "url", "url": "https://x/clock.png"}}
CALLS = {
    "role": "assistant",
    "content": [{"type": "text", "text": "Checking."}, use("a"), use("b")],
}


@pytest.mark.parametrize(
    "messages",
    [
        [ASK, CALLS, {"role": "user", "content": [result("a"), result("b")]}],
        # results in any order, with text after them
        [
            ASK,
            CALLS,
            {"role": "user", "content": [result("b"), result("a"), {"type": "text", "text": "ok"}]},
        ],
        [ASK, CALLS],  # ends on the calls: nothing answers them yet
        [ASK, {"role": "assistant", "content": "plain"}, {"role": "user", "content": "more"}],
    ],
    ids=["answered", "reordered", "trailing-call", "no-tools"],
)
def test_pairs_that_match_pass(messages: list[dict]) -> None:
    check_tool_pairs(messages)


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (
            [ASK, CALLS, {"role": "user", "content": [result("a"), result("b"), result("c")]}],
            'messages.2.content.2: tool_result for tool_use_id "c", which no tool_use block '
            "of the previous (assistant) message has",
        ),
        (
            [{"role": "user", "content": [result("a")]}],
            'messages.0.content.0: tool_result for tool_use_id "a", which no tool_use block '
            "of the previous (assistant) message has",
        ),
        (
            [ASK, CALLS, {"role": "user", "content": [result("a")]}],
            'messages.1: tool_use ids without a tool_result block in the next message: "b" '
            "(the results of all of a message's tool_use blocks go in the one user message "
            "right after it)",
        ),
        (
            [ASK, CALLS, {"role": "user", "content": "never mind"}],
            'messages.1: tool_use ids without a tool_result block in the next message: "a", '
            '"b" (the results of all of a message\'s tool_use blocks go in the one user '
            "message right after it)",
        ),
        # a result two turns late answers nothing: only the turn before counts
        (
            [
                ASK,
                {"role": "assistant", "content": [use("a")]},
                {"role": "user", "content": [result("a")]},
                {"role": "assistant", "content": "It is noon."},
                {"role": "user", "content": [result("a")]},
            ],
            'messages.4.content.0: tool_result for tool_use_id "a", which no tool_use block '
            "of the previous (assistant) message has",
        ),
        # the results of one turn's calls split over two user turns
        (
            [
                ASK,
                CALLS,
                {"role": "user", "content": [result("a")]},
                {"role": "user", "content": [result("b")]},
            ],
            'messages.1: tool_use ids without a tool_result block in the next message: "b" '
            "(the results of all of a message's tool_use blocks go in the one user message "
            "right after it)",
        ),
        # text before the results, or between them
        (
            [ASK, CALLS, {"role": "user", "content": [TEXT, result("a"), result("b")]}],
            "messages.2.content.1: tool_result blocks must come first in their message, before "
            'any other content (messages.2.content.0 is of type "text")',
        ),
        (
            [ASK, CALLS, {"role": "user", "content": [result("a"), IMAGE, TEXT, result("b")]}],
            "messages.2.content.3: tool_result blocks must come first in their message, before "
            'any other content (messages.2.content.1 is of type "image")',
        ),
    ],
    ids=[
        "unknown-id",
        "no-call-before",
        "one-unanswered",
        "none-answered",
        "stale",
        "split",
        "text-first",
        "image-between",
    ],
)
def test_pairs_that_do_not_match_are_refused(messages: list[dict], message: str) -> None:
    with pytest.raises(ApiError) as err:
        check_tool_pairs(messages)
    assert (err.value.kind, err.value.message) == ("invalid_request", message)


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        (
            [ASK, {"role": "assistant", "content": [use("a"), use("a")]}],
            'messages.1.content.1: a second tool_use block with id "a"; each must be unique',
        ),
        (
            [ASK, CALLS, {"role": "user", "content": [result("a"), result("b"), result("a")]}],
            'messages.2.content.2: a second tool_result block with tool_use_id "a"; each '
            "must be unique",
        ),
    ],
    ids=["two-calls-one-id", "two-answers-one-call"],
)
def test_ids_are_unique_within_a_message(messages: list[dict], message: str) -> None:
    with pytest.raises(ApiError) as err:
        check_tool_pairs(messages)
    assert err.value.message == message


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/messages/count_tokens"])
def test_over_http_in_anthropic_shape(client: httpx.Client, route: str) -> None:
    messages = [ASK, CALLS, {"role": "user", "content": [result("a")]}]
    r = client.post(route, json={"model": "m", "max_tokens": 4, "messages": messages})
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "messages.1: tool_use ids without a tool_result block in the next "
            'message: "b" (the results of all of a message\'s tool_use blocks go in the one '
            "user message right after it)",
        },
    }


@pytest.mark.parametrize("route", ["/v1/messages", "/v1/messages/count_tokens"])
@pytest.mark.parametrize(
    ("turns", "message"),
    [
        (
            [
                {"role": "user", "content": [result("a")]},
                {"role": "user", "content": [result("b")]},
            ],
            'messages.1: tool_use ids without a tool_result block in the next message: "b" '
            "(the results of all of a message's tool_use blocks go in the one user message "
            "right after it)",
        ),
        (
            [{"role": "user", "content": [TEXT, result("a"), result("b")]}],
            "messages.2.content.1: tool_result blocks must come first in their message, before "
            'any other content (messages.2.content.0 is of type "text")',
        ),
    ],
    ids=["split", "text-first"],
)
def test_split_or_late_results_over_http(
    client: httpx.Client, route: str, turns: list[dict], message: str
) -> None:
    body = {"model": "m", "max_tokens": 4, "messages": [ASK, CALLS, *turns]}
    r = client.post(route, json=body)
    assert (r.status_code, r.json()) == (
        400,
        {"type": "error", "error": {"type": "invalid_request_error", "message": message}},
    )
    # the same results in one turn, text last, are counted
    fixed = [ASK, CALLS, {"role": "user", "content": [result("a"), result("b"), TEXT]}]
    r = client.post("/v1/messages/count_tokens", json={"model": "m", "messages": fixed})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0

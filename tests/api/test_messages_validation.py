"""Edge cases of an Anthropic Messages request that Anthropic's API refuses with
a 400, refused here in the same envelope with a message naming the field.

Each rule comes from Anthropic's API reference or its observed answers (the
message text is ours):

* only the final message may have empty ``content``, and only when it is an
  assistant turn ("all messages must have non-empty content except for the
  optional final assistant message");
* ``thinking: {"type": "enabled"}`` needs ``budget_tokens``, at least 1024 and
  less than ``max_tokens`` (API reference, ``ThinkingConfigEnabled``);
* ``POST /v1/messages/count_tokens`` needs ``model`` (``MessageCountTokensParams``).

The ``client`` fixture checks every response against the document.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import pytest

from mlxspec.errors import ApiError
from mlxspec.handlers.messages.anthropic import check_empty_turns
from tests.helpers import anthropic_sdk

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
ROUTES = [MESSAGES, COUNT]
USER = {"role": "user", "content": "hi"}
EMPTY = "is empty: every message needs content except a final assistant message (a prefill)"


@pytest.fixture()
def sdk(tiny_server) -> Iterator[anthropic.Anthropic]:
    with anthropic_sdk(tiny_server.base) as client:
        yield client


def post(client: httpx.Client, route: str, **fields: object) -> httpx.Response:
    return client.post(route, json={"model": "m", "max_tokens": 1, "messages": [USER], **fields})


def refused(r: httpx.Response, message: str) -> None:
    """``r`` is Anthropic's 400 envelope carrying exactly ``message``."""
    assert r.status_code == 400, r.text
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }


# --- empty content ---------------------------------------------------------------


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("messages", "where"),
    [
        ([{"role": "user", "content": []}], "messages.0.content"),
        ([{"role": "user", "content": ""}], "messages.0.content"),
        (
            [USER, {"role": "assistant", "content": "ok"}, {"role": "user", "content": []}],
            "messages.2.content",
        ),
        ([USER, {"role": "assistant", "content": []}, USER], "messages.1.content"),
        ([USER, {"role": "assistant", "content": ""}, USER], "messages.1.content"),
        ([{"role": "user", "content": [{"type": "text", "text": ""}]}], "messages.0.content"),
        (
            [USER, {"role": "assistant", "content": [{"type": "text", "text": ""}] * 2}, USER],
            "messages.1.content",
        ),
    ],
    ids=[
        "user-list",
        "user-string",
        "last-user",
        "assistant-list",
        "assistant-string",
        "user-empty-text-block",
        "assistant-empty-text-blocks",
    ],
)
def test_an_empty_turn_is_refused(
    client: httpx.Client, route: str, messages: list[dict], where: str
) -> None:
    refused(post(client, route, messages=messages), f"{where} {EMPTY}")


@pytest.mark.parametrize("content", [[], "", [{"type": "text", "text": ""}]])
def test_an_empty_final_assistant_turn_is_an_empty_prefill(
    client: httpx.Client, content: object
) -> None:
    messages = [USER, {"role": "assistant", "content": content}]
    r = post(client, MESSAGES, messages=messages)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] == 1
    assert post(client, COUNT, messages=messages).json()["input_tokens"] > 0


def test_check_empty_turns_looks_at_every_turn_but_the_last() -> None:
    check_empty_turns([USER, {"role": "assistant", "content": []}])
    check_empty_turns(
        [USER, {"role": "assistant", "content": [{"type": "text", "text": "a"}]}, USER]
    )
    with pytest.raises(ApiError) as err:
        check_empty_turns([USER, USER, {"role": "assistant", "content": ""}, USER])
    assert (err.value.kind, err.value.message) == ("invalid_request", f"messages.2.content {EMPTY}")


# --- thinking budget -------------------------------------------------------------


@pytest.mark.parametrize(
    "thinking", [{"type": "disabled", "budget_tokens": 5}, {"type": "adaptive"}]
)
def test_a_budget_is_checked_only_when_thinking_is_enabled(
    client: httpx.Client, thinking: dict
) -> None:
    r = post(client, MESSAGES, thinking=thinking)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] == 1


ENABLED = {"type": "enabled", "budget_tokens": 1024}


@pytest.mark.parametrize("route", ROUTES)
def test_enabled_thinking_without_a_budget_is_refused(client: httpx.Client, route: str) -> None:
    refused(
        post(client, route, max_tokens=2048, thinking={"type": "enabled"}),
        'thinking.budget_tokens is required when thinking.type is "enabled" (at least 1024, '
        "and less than max_tokens)",
    )


@pytest.mark.parametrize("route", ROUTES)
def test_a_budget_below_1024_is_refused(client: httpx.Client, route: str) -> None:
    r = post(client, route, max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 1023})
    refused(r, "Invalid value for 'thinking.budget_tokens': 1023 is less than the minimum of 1024")


@pytest.mark.parametrize("max_tokens", [1024, 1000])
def test_a_budget_not_below_max_tokens_is_refused(client: httpx.Client, max_tokens: int) -> None:
    refused(
        post(client, MESSAGES, max_tokens=max_tokens, thinking=ENABLED),
        f"thinking.budget_tokens (1024) must be less than max_tokens ({max_tokens}): the "
        "thinking budget is part of max_tokens",
    )


def test_a_budget_within_max_tokens_runs(sdk: anthropic.Anthropic) -> None:
    # the tiny ChatML template has no thinking channel: the reply is the plain one
    ask = {"model": "m", "messages": [USER], "extra_body": {"temperature": 0}}
    thought = sdk.messages.create(max_tokens=1025, thinking=ENABLED, **ask)
    plain = sdk.messages.create(max_tokens=1025, **ask)
    assert thought.usage.output_tokens == plain.usage.output_tokens > 0
    assert thought.content == plain.content
    assert thought.stop_reason == plain.stop_reason
    # no max_tokens to compare on count_tokens; adaptive and disabled take no budget
    counted = sdk.messages.count_tokens(model="m", messages=[USER], thinking=ENABLED)
    assert (
        counted.input_tokens == sdk.messages.count_tokens(model="m", messages=[USER]).input_tokens
    )
    for kind in ("adaptive", "disabled"):
        r = sdk.messages.create(max_tokens=1, thinking={"type": kind}, **ask)
        assert r.usage.output_tokens == 1


# --- count_tokens needs a model --------------------------------------------------


def test_count_tokens_without_a_model_is_refused(client: httpx.Client) -> None:
    refused(client.post(COUNT, json={"messages": [USER], "max_tokens": 4}), "model is required")


def test_count_tokens_with_any_model_name_counts(client: httpx.Client) -> None:
    counts = [
        client.post(COUNT, json={"model": model, "messages": [USER]}).json()
        for model in ("claude-sonnet-4-5", "m", "")
    ]
    assert counts == [{"input_tokens": 21}] * 3

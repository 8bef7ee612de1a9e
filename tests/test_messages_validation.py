"""Edge cases of an Anthropic Messages request that Anthropic's API refuses with
a 400, refused here in the same envelope with a message naming the field.

Each rule comes from Anthropic's API reference or its observed answers (the
message text is ours):

* only the final message may have empty ``content``, and only when it is an
  assistant turn ("all messages must have non-empty content except for the
  optional final assistant message").

The ``client`` fixture checks every response against the document.
"""

from __future__ import annotations

import httpx
import pytest

from mlxspec.errors import ApiError
from mlxspec.handlers.anthropic import check_empty_turns

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
ROUTES = [MESSAGES, COUNT]
USER = {"role": "user", "content": "hi"}
EMPTY = "is empty: every message needs content except a final assistant message (a prefill)"


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
    ],
    ids=["user-list", "user-string", "last-user", "assistant-list", "assistant-string"],
)
def test_an_empty_turn_is_refused(
    client: httpx.Client, route: str, messages: list[dict], where: str
) -> None:
    refused(post(client, route, messages=messages), f"{where} {EMPTY}")


@pytest.mark.parametrize("content", [[], ""])
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

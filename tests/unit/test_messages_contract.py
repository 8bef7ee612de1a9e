"""The contract checker on the Anthropic surface, and the document's messages section.

Negative controls run the checker against a fake server (``httpx.MockTransport``)
that answers what a test tells it to, so each rule is shown to catch its breach.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from mlxspec.conformance.contract import ContractViolation
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.handlers.requests import SAMPLER_FIELDS
from mlxspec.openapi import load_spec

SPEC = load_spec()
MESSAGES = "/v1/messages"
JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
REQUEST = {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
HEAD = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m"}
START = {
    "type": "message_start",
    "message": {
        **HEAD,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 0},
    },
}
TEXT_START = {
    "type": "content_block_start",
    "index": 0,
    "content_block": {"type": "text", "text": ""},
}
TEXT_DELTA = {
    "type": "content_block_delta",
    "index": 0,
    "delta": {"type": "text_delta", "text": "Hi"},
}
STOP = {"type": "content_block_stop", "index": 0}
END = {
    "type": "message_delta",
    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
    "usage": {"input_tokens": 3, "output_tokens": 1},
}
DONE = {"type": "message_stop"}
GOOD = [START, {"type": "ping"}, TEXT_START, TEXT_DELTA, STOP, END, DONE]


def frames(*events: Any) -> bytes:
    out = b""
    for event in events:
        if isinstance(event, bytes):
            out += event
            continue
        out += f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode()
    return out


def answer(
    status: int, body: bytes, headers: dict, path: str = MESSAGES, stream: bool = True
) -> httpx.Response:
    transport = httpx.MockTransport(
        lambda _req: httpx.Response(status, headers=headers, content=body)
    )
    with checking_client("http://fake", transport=transport) as c:
        return c.post(path, json={**REQUEST, "stream": stream})


def anthropic_error(kind: str, message: str = "m") -> bytes:
    return json.dumps({"type": "error", "error": {"type": kind, "message": message}}).encode()


def test_conforming_anthropic_responses_pass() -> None:
    assert answer(200, frames(*GOOD), SSE).status_code == 200
    error = {"type": "error", "error": {"type": "api_error", "message": "generation failed"}}
    assert answer(200, frames(START, TEXT_START, TEXT_DELTA, error), SSE).status_code == 200
    assert answer(400, anthropic_error("invalid_request_error"), JSON).status_code == 400
    r = answer(404, anthropic_error("not_found_error"), JSON, path="/v1/messages/x")
    assert r.status_code == 404
    reply = {**HEAD, "content": [], "stop_reason": "end_turn", "stop_sequence": None}
    reply["usage"] = {"input_tokens": 3, "output_tokens": 1}
    assert answer(200, json.dumps(reply).encode(), JSON, stream=False).status_code == 200


TOOL_START = {
    "type": "content_block_start",
    "index": 0,
    "content_block": {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}},
}


@pytest.mark.parametrize(
    ("body", "rule"),
    [
        (frames(*GOOD).replace(b"event: ping\n", b""), "frame is not 'event: '"),
        (frames(*GOOD).replace(b"event: ping", b"event: message_stop"), "carries type"),
        (frames(*GOOD[1:]), "starts with message_start"),
        (frames(*GOOD[:-1]), "ends with message_delta, message_stop"),
        (frames(START, TEXT_DELTA, STOP, END, DONE), "which is not open"),
        (frames(START, TEXT_START, END, DONE), "never stopped"),
        (frames(START, {**TEXT_START, "index": 1}, STOP, END, DONE), "starts out of order"),
        (frames(START, TOOL_START, TEXT_DELTA, STOP, END, DONE), "text_delta inside a tool_use"),
        (
            frames(START, {"type": "error", "error": {"type": "api_error", "message": "x"}}, DONE),
            "nothing may follow an error",
        ),
        (
            frames(START, {**TEXT_START, "content_block": {"type": "image"}}, STOP, END, DONE),
            "frame 1",
        ),
        (frames(START, {**END, "delta": {"stop_reason": "length"}}, DONE), "frame 1"),
        (frames(*GOOD).replace(b"msg_1", b"chatcmpl-1"), "frame 0"),
    ],
    ids=[
        "data only",
        "name differs from type",
        "no message_start",
        "no message_stop",
        "delta before start",
        "block not stopped",
        "index skips",
        "wrong delta kind",
        "frame after error",
        "unknown block type",
        "openai finish reason",
        "id prefix",
    ],
)
def test_stream_breaches_are_caught(body: bytes, rule: str) -> None:
    with pytest.raises(ContractViolation, match=rule):
        answer(200, body, SSE)


@pytest.mark.parametrize(
    ("status", "body", "path"),
    [
        (400, anthropic_error("api_error"), MESSAGES),
        (500, anthropic_error("invalid_request_error"), MESSAGES),
        (
            400,
            b'{"error": {"message": "m", "type": "invalid_request_error", "param": null}}',
            MESSAGES,
        ),
        (404, b'{"error": {"message": "not found", "type": "not_found_error"}}', "/v1/messages/x"),
        (404, anthropic_error("invalid_request_error"), "/v1/messages/x"),
    ],
    ids=["400 typed api_error", "500 typed invalid", "openai envelope", "openai 404", "404 type"],
)
def test_error_breaches_are_caught(status: int, body: bytes, path: str) -> None:
    with pytest.raises(ContractViolation):
        answer(status, body, JSON, path=path, stream=False)


def test_messages_document_section() -> None:
    schemas = SPEC["components"]["schemas"]
    create = schemas["CreateMessageRequest"]
    assert create["additionalProperties"] is True
    own = create["allOf"][1]["properties"]
    assert create["allOf"][1]["required"] == ["max_tokens"]
    assert "logit_bias" not in own
    anthropic_fields = ("max_tokens", "temperature", "top_p", "top_k", "stop_sequences", "stream")
    # Fields borrowed from the chat parameters that Anthropic's API lacks are ours,
    # and they must cover every sampler field the translation carries.
    chat_fields = schemas["GenerationParameters"]["properties"]
    extras = [f for f in own if f in chat_fields and f not in anthropic_fields]
    assert set(SAMPLER_FIELDS) - set(anthropic_fields) <= set(extras)
    for field in extras:
        assert own[field]["x-mlxspec-extension"] is True, field
    for field in anthropic_fields:
        assert "x-mlxspec-extension" not in own[field], field
    prompt = schemas["AnthropicPromptParameters"]["properties"]
    assert prompt["session_id"]["x-mlxspec-extension"] is True
    assert prompt["prompt_cache_key"]["x-mlxspec-extension"] is True
    events = schemas["AnthropicSSEEvent"]["properties"]["event"]["enum"]
    assert set(events) == {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "ping",
        "error",
    }

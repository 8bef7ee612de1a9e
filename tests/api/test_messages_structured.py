"""Anthropic structured output: ``output_config.format`` (and the beta top-level
``output_format``) on ``/v1/messages`` is enforced by chat's grammar mask.

The tiny random model shows the mask at work (JSON that validates, also when
streamed); the real SmolLM2 model answers the SDK's ``messages.parse`` with a
typed object, which is what a client of this feature relies on
(``tests/real/test_messages.py``).
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from mlxspec.handlers.messages.anthropic import to_chat_body
from tests.helpers import TINY_SCHEMA

MESSAGES = "/v1/messages"
USER = [{"role": "user", "content": "hi"}]
SCHEMA = TINY_SCHEMA
COMPACT = {"type": "json_schema", "schema": SCHEMA, "any_whitespace": False}


def test_translation_to_response_format() -> None:
    base = {"model": "m", "max_tokens": 5, "messages": USER}
    expected = {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": SCHEMA, "any_whitespace": False},
    }
    config = to_chat_body({**base, "output_config": {"format": COMPACT, "effort": "low"}})
    assert config["response_format"] == expected
    assert to_chat_body({**base, "output_format": COMPACT})["response_format"] == expected
    # output_config.format wins over the beta spelling
    other = {"type": "json_schema", "schema": {"type": "object"}}
    both = to_chat_body({**base, "output_config": {"format": COMPACT}, "output_format": other})
    assert both["response_format"] == expected
    plain = to_chat_body({**base, "output_format": {"type": "json_schema", "schema": SCHEMA}})
    assert plain["response_format"]["json_schema"] == {"name": "output", "schema": SCHEMA}
    for none in ({}, {"output_config": None}, {"output_config": {"effort": "high"}}):
        assert "response_format" not in to_chat_body({**base, **none})


@pytest.mark.parametrize("field", ["output_config", "output_format"])
def test_reply_text_matches_the_schema(client: httpx.Client, field: str) -> None:
    fmt = {"format": COMPACT} if field == "output_config" else COMPACT
    body = {"model": "m", "max_tokens": 60, "messages": USER, field: fmt}
    r = client.post(MESSAGES, json=body)
    assert r.status_code == 200 and "warning" not in r.headers
    message = r.json()
    assert [block["type"] for block in message["content"]] == ["text"]
    jsonschema.validate(json.loads(message["content"][0]["text"]), SCHEMA)
    assert message["stop_reason"] == "end_turn"


def test_streamed_reply_matches_the_schema(client: httpx.Client) -> None:
    body = {
        "model": "m",
        "max_tokens": 60,
        "messages": USER,
        "stream": True,
        "output_config": {"format": COMPACT},
    }
    r = client.post(MESSAGES, json=body)
    assert r.status_code == 200
    events = [json.loads(line[6:]) for line in r.text.split("\n") if line.startswith("data: ")]
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")
    jsonschema.validate(json.loads(text), SCHEMA)
    assert [e["delta"]["stop_reason"] for e in events if e["type"] == "message_delta"] == [
        "end_turn"
    ]


@pytest.mark.parametrize("route", [MESSAGES, "/v1/messages/count_tokens"])
def test_a_prefill_with_structured_output_is_400(client: httpx.Client, route: str) -> None:
    prefill = [*USER, {"role": "assistant", "content": '{"kind": "'}]
    body = {
        "model": "m",
        "max_tokens": 8,
        "messages": prefill,
        "output_config": {"format": COMPACT},
    }
    r = client.post(route, json=body)
    assert r.status_code == 400
    assert r.json()["error"] == {
        "type": "invalid_request_error",
        "message": "a final assistant message (a prefill) cannot be combined with structured "
        "output (output_config.format): the reply must hold the whole JSON document",
    }


def test_count_tokens_counts_the_degrade_instruction(client: httpx.Client) -> None:
    # a schema xgrammar refuses runs unconstrained, described in a system message
    body = {
        "model": "m",
        "max_tokens": 4,
        "messages": USER,
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "foo"}}},
    }
    counted = client.post("/v1/messages/count_tokens", json=body).json()["input_tokens"]
    plain = {k: v for k, v in body.items() if k != "output_config"}
    alone = client.post("/v1/messages/count_tokens", json=plain).json()["input_tokens"]
    r = client.post(MESSAGES, json=body)
    assert r.headers["warning"].startswith("grammar not enforced")
    usage = r.json()["usage"]
    assert counted == usage["input_tokens"] + usage.get("cache_read_input_tokens", 0) > alone
    missing = {**body, "output_config": {"format": {"type": "json_schema"}}}
    r = client.post("/v1/messages/count_tokens", json=missing)
    assert (r.status_code, r.json()["error"]["message"]) == (
        400,
        "output_config.format.schema is required",
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "output_config",
            {"format": {"type": "json_schema"}},
            "output_config.format.schema is required",
        ),
        (
            "output_config",
            {"format": {"type": "json_schema", "schema": "{}"}},
            "Invalid type for 'output_config.format.schema': expected an object, but got a "
            "string instead.",
        ),
        (
            "output_format",
            {"type": "xml", "schema": {}},
            'Invalid value for \'output_format.type\': expected "json_schema", got "xml"',
        ),
        (
            "metadata",
            {"user_id": 5},
            "Invalid type for 'metadata.user_id': expected a string or null, but got an "
            "integer instead.",
        ),
    ],
)
def test_malformed_output_fields_are_400(
    client: httpx.Client, field: str, value: object, message: str
) -> None:
    r = client.post(MESSAGES, json={"model": "m", "max_tokens": 5, "messages": USER, field: value})
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }

"""Generic 400 messages on the real routes speak JSON, not Python.

Fields without an ``x-mlxspec-error`` get their text from
``mlxspec.openapi.schema_errors``: a boolean is ``a boolean`` (not ``True``), values are
shown as JSON, a tagged union names what its tag's branch lacks. Each surface
keeps its own error envelope. The ``client`` fixture checks every response
against the document.
"""

from __future__ import annotations

import httpx
import pytest

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
MESSAGES = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("route", "body", "param", "message"),
    [
        (
            "/v1/chat/completions",
            {**CHAT, "max_tokens": True},
            "max_tokens",
            "Invalid type for 'max_tokens': expected an integer or null, but got a boolean "
            "instead.",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "tool_choice": "sometimes"},
            "tool_choice",
            'Invalid value for \'tool_choice\': "sometimes" is not one of "none", "auto", '
            '"required"',
        ),
        (
            "/v1/embeddings",
            {"input": "x", "encoding_format": "hex"},
            "encoding_format",
            'Invalid value for \'encoding_format\': "hex" is not one of "float", "base64", null',
        ),
        ("/v1/embeddings", {"input": []}, "input", "`input` must not be empty"),
        (
            "/v1/embeddings",
            {"input": ["a", {"b": 2}]},
            "input[1]",
            "`input` must be a string, an array of strings, an array of token ids or an array "
            "of token-id arrays",
        ),
        (
            "/v1/responses",
            {"input": 5},
            "input",
            "Invalid type for 'input': expected a string or an array, but got an integer instead.",
        ),
        (
            "/v1/responses",
            {"input": "hi", "text": {"format": {"type": "json_schema"}}},
            "text.format.name",
            "text.format.name is required",
        ),
        (
            "/v1/responses",
            {"input": "hi", "text": {"format": {"type": "json_schema", "name": 7}}},
            "text.format.name",
            "Invalid type for 'text.format.name': expected a string, but got an integer instead.",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "tools": [{"type": "function", "function": {"name": ""}}]},
            "tools[0].function.name",
            "Invalid value for 'tools[0].function.name': \"\" should be non-empty",
        ),
        (
            "/v1/responses",
            {"input": "hi", "tools": [{"type": "function", "name": ""}]},
            "tools[0].name",
            "Invalid value for 'tools[0].name': \"\" should be non-empty",
        ),
        # a tag missing or refused is reported before what the tag would ask for
        (
            "/v1/responses",
            {"input": "hi", "text": {"format": {}}},
            "text.format.type",
            "text.format.type is required",
        ),
        (
            "/v1/chat/completions",
            {**CHAT, "tools": [{"function": {"name": "a"}}]},
            "tools[0].type",
            "tools[0].type is required",
        ),
        # fields whose state mlxspec does not keep are refused, never silently dropped
        (
            "/v1/responses",
            {"input": "hi", "conversation": "conv_1"},
            "conversation",
            "conversation is not supported; continue with previous_response_id instead",
        ),
        (
            "/v1/responses/input_tokens",
            {"input": "hi", "prompt": {"id": "pmpt_1"}},
            "prompt",
            "prompt (a stored prompt template) is not supported; send instructions and input "
            "instead",
        ),
    ],
)
def test_openai_routes(client: httpx.Client, route: str, body: dict, param: str, message: str):
    r = client.post(route, json=body)
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            {"stop_sequences": "END"},
            "Invalid type for 'stop_sequences': expected an array or null, but got a string "
            "instead.",
        ),
        ({"tool_choice": {}}, "tool_choice.type is required"),
        (
            {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "", "name": "f", "input": {}}],
                    },
                ]
            },
            "Invalid value for 'messages[1].content[0].id': \"\" should be non-empty",
        ),
        (
            {"output_config": {"format": {"type": "text"}}},
            'Invalid value for \'output_config.format.type\': expected "json_schema", got "text"',
        ),
        (
            {"tools": [{"name": "", "input_schema": {"type": "object"}}]},
            "Invalid value for 'tools[0].name': \"\" should be non-empty",
        ),
    ],
)
def test_anthropic_route_keeps_its_envelope(
    client: httpx.Client, fields: dict, message: str
) -> None:
    r = client.post("/v1/messages", json={**MESSAGES, **fields})
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }


def test_an_unsupported_content_part_says_what_a_prompt_holds(client: httpx.Client) -> None:
    # not a schema error: the prompt builder refuses a block it cannot render
    block = {"type": "document", "source": {"type": "text", "data": "x"}}
    messages = [{"role": "user", "content": [block]}]
    r = client.post("/v1/messages", json={**MESSAGES, "messages": messages})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400,
        "unsupported content part type 'document': a prompt here holds text (and images or "
        "audio on a model that reads them)",
    )

"""``POST /v1/messages`` and ``/v1/messages/count_tokens`` on the tiny model, through
the official ``anthropic`` SDK and the contract-checking ``client``.

The SDK's HTTP clients (``httpx2``, the fork the SDK requires) check every
response against the OpenAPI document (each stream frame too). The chat
completion of the same prompt is the oracle: an Anthropic request is a
translation onto the chat path, so under greedy decoding its text and token
counts must equal the chat reply's. (The SDK no longer takes ``temperature``
as an argument; it travels in ``extra_body``.)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from mlxspec.config import ServeConfig
from mlxspec.conformance.httpx_checks import checking_async_client
from mlxspec.http.app import create_app
from tests.helpers import anthropic_sdk

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hello"}]
GREEDY = {"temperature": 0}


@pytest.fixture()
def sdk(tiny_server) -> Iterator[anthropic.Anthropic]:
    with anthropic_sdk(tiny_server.base) as client:
        yield client


def prompt_tokens(usage: Any) -> int:
    """The whole prompt: Anthropic splits it into uncached and cache-read tokens."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def chat(client: httpx.Client, **fields: Any) -> dict[str, Any]:
    r = client.post(CHAT, json={"messages": USER, **fields})
    assert r.status_code == 200, r.text
    return r.json()


def named_events(r: httpx.Response) -> list[tuple[str, dict]]:
    out = []
    for frame in r.text.strip("\n").split("\n\n"):
        event, data = frame.split("\n")
        out.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


# --- create, non-streamed and streamed ------------------------------------------


def test_create_matches_the_chat_reply(sdk: anthropic.Anthropic, client: httpx.Client) -> None:
    oracle = chat(client, max_tokens=6, **GREEDY)
    m = sdk.messages.create(model="claude-x", max_tokens=6, messages=USER, extra_body=GREEDY)
    assert m.id.startswith("msg_") and len(m.id) == 36
    assert (m.type, m.role, m.model) == ("message", "assistant", "tiny-llama")
    assert [(b.type, b.text) for b in m.content] == [
        ("text", oracle["choices"][0]["message"]["content"])
    ]
    assert (m.stop_reason, m.stop_sequence) == ("max_tokens", None)
    assert prompt_tokens(m.usage) == oracle["usage"]["prompt_tokens"] == 21
    assert m.usage.output_tokens == 6


def test_stream_event_sequence_and_final_message(sdk: anthropic.Anthropic) -> None:
    whole = sdk.messages.create(model="x", max_tokens=5, messages=USER, extra_body=GREEDY)
    raw = sdk.messages.create(
        model="x", max_tokens=5, messages=USER, stream=True, extra_body=GREEDY
    )
    events = list(raw)
    types = [e.type for e in events]
    assert types == [
        "message_start",
        "content_block_start",
        *["content_block_delta"] * 5,
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0].message
    assert start.id.startswith("msg_") and start.content == [] and start.stop_reason is None
    assert (start.usage.input_tokens, start.usage.output_tokens) == (21, 0)
    assert events[1].content_block.type == "text" and events[1].content_block.text == ""
    assert "".join(e.delta.text for e in events[2:7]) == whole.content[0].text
    assert {e.index for e in events[1:8]} == {0}
    assert events[8].delta.stop_reason == "max_tokens"
    assert events[8].usage.output_tokens == 5

    with sdk.messages.stream(model="x", max_tokens=5, messages=USER, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == whole.content[0].text
    assert final.model_dump(exclude={"id"}) == whole.model_dump(exclude={"id"})


def test_stream_bytes_have_event_lines_and_a_ping(client: httpx.Client) -> None:
    body = {"messages": USER, "max_tokens": 2, "stream": True, **GREEDY}
    r = client.post(MESSAGES, json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    events = named_events(r)
    assert [name for name, _ in events] == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert all(data["type"] == name for name, data in events)
    assert events[1][1] == {"type": "ping"}
    delta = events[-2][1]
    assert delta["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    usage = delta["usage"]
    assert usage["input_tokens"] + usage.get("cache_read_input_tokens", 0) == 21
    assert usage["output_tokens"] == 2


def test_prompt_cache_reads_are_reported(sdk: anthropic.Anthropic) -> None:
    """The same prompt twice: the second reuses the first's prompt cache, and
    usage splits the prompt into uncached ``input_tokens`` and
    ``cache_read_input_tokens`` (Anthropic's meaning), in both reply forms."""
    question = [{"role": "user", "content": "cache me if you can"}]
    sdk.messages.create(model="x", max_tokens=1, messages=question)
    again = sdk.messages.create(model="x", max_tokens=1, messages=question)
    assert again.usage.cache_read_input_tokens and again.usage.cache_read_input_tokens > 0
    assert prompt_tokens(again.usage) == 37
    with sdk.messages.stream(model="x", max_tokens=1, messages=question) as stream:
        final = stream.get_final_message()
    assert final.usage.cache_read_input_tokens and final.usage.cache_read_input_tokens > 0
    assert prompt_tokens(final.usage) == 37


def test_async_sdk(tiny_server) -> None:
    async def run() -> tuple[str, str]:
        async with anthropic.AsyncAnthropic(
            base_url=tiny_server.base,
            api_key="k",
            max_retries=0,
            http_client=checking_async_client(timeout=60, http=httpx2),
        ) as sdk:
            m = await sdk.messages.create(model="x", max_tokens=3, messages=USER, extra_body=GREEDY)
            async with sdk.messages.stream(
                model="x", max_tokens=3, messages=USER, extra_body=GREEDY
            ) as stream:
                final = await stream.get_final_message()
            return m.content[0].text, final.content[0].text

    plain, streamed = asyncio.run(run())
    assert plain == streamed == "\n\n\n"


def test_stop_sequence_is_reported(sdk: anthropic.Anthropic) -> None:
    """A seeded sample (deterministic) gives varied text; a stop from its middle
    cuts it there and is echoed as ``stop_sequence``."""
    fields = {"temperature": 8.0, "seed": 11}  # hot: the tiny model loves "\n"
    full = sdk.messages.create(model="x", max_tokens=16, messages=USER, extra_body=fields)
    text = full.content[0].text
    stop = text[4:6]
    assert len(stop) == 2 and text.find(stop) > 0
    m = sdk.messages.create(
        model="x",
        max_tokens=16,
        messages=USER,
        stop_sequences=["\u0000never", stop],
        extra_body=fields,
    )
    assert m.content[0].text == text[: text.find(stop)]
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)
    with sdk.messages.stream(
        model="x",
        max_tokens=16,
        messages=USER,
        stop_sequences=["\u0000never", stop],
        extra_body=fields,
    ) as stream:
        final = stream.get_final_message()
    assert (final.stop_reason, final.stop_sequence) == ("stop_sequence", stop)
    assert final.content[0].text == m.content[0].text


def test_greedy_newlines_stop_at_once_with_an_empty_reply(sdk: anthropic.Anthropic) -> None:
    m = sdk.messages.create(
        model="x", max_tokens=8, messages=USER, stop_sequences=["\n\n"], extra_body=GREEDY
    )
    assert m.content == []
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "\n\n")
    assert m.usage.output_tokens == 2


def test_conversation_with_system_tools_and_tool_results(
    sdk: anthropic.Anthropic, client: httpx.Client
) -> None:
    """A tool round trip's second request runs on the chat path: the same
    prompt and reply. The tiny template ignores tools, so both write the call
    and its result into the history as text; ``tool_choice`` none keeps the
    tool instruction out, which would not fit the 256-token window with them
    (the tool-template e2e lives with the tool parsers)."""
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "call it", "signature": "s"},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
            ],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"}],
        },
    ]
    tools = [{"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object"}}]
    m = sdk.messages.create(
        model="x",
        max_tokens=3,
        system=[{"type": "text", "text": "Be brief."}],
        messages=messages,
        tools=tools,
        tool_choice={"type": "none"},
        extra_body=GREEDY,
    )
    oracle = client.post(
        CHAT,
        json={
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "weather in Paris?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "toolu_1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
            ],
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "description": "Weather.",
                        "parameters": {"type": "object"},
                    },
                }
            ],
            "tool_choice": "none",
            "max_tokens": 3,
            **GREEDY,
        },
    ).json()
    assert prompt_tokens(m.usage) == oracle["usage"]["prompt_tokens"]
    assert m.content[0].text == oracle["choices"][0]["message"]["content"]


# --- count_tokens ---------------------------------------------------------------


def test_count_tokens_equals_the_prompt_length(
    sdk: anthropic.Anthropic, client: httpx.Client
) -> None:
    system = "You are terse."
    count = sdk.messages.count_tokens(model="x", system=system, messages=USER)
    oracle = chat(client, messages=[{"role": "system", "content": system}, *USER], max_tokens=1)
    assert count.input_tokens == oracle["usage"]["prompt_tokens"] == 44
    m = sdk.messages.create(model="x", max_tokens=1, system=system, messages=USER)
    assert prompt_tokens(m.usage) == count.input_tokens
    r = client.post(COUNT, json={"model": "x", "messages": USER, "max_tokens": 5, "temperature": 9})
    assert r.json() == {"input_tokens": 21}


@pytest.mark.parametrize("stop", [5, -1, 1.5, True, "x", {"a": 1}])
def test_count_tokens_ignores_generation_fields_of_any_type(client: httpx.Client, stop) -> None:
    # a fresh user found a 500 here: stop_sequences was read but never validated
    body = {"model": "x", "messages": USER, "stop_sequences": stop, "top_k": "x"}
    r = client.post(COUNT, json=body)
    assert r.status_code == 200, r.text
    assert r.json() == {"input_tokens": 21}


# --- errors: Anthropic's envelope, from validation and from the engine ------------


def assert_error(r: httpx.Response, status: int, kind: str, message: str | None = None) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"type", "error"} and body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == kind
    if message is not None:
        assert body["error"]["message"] == message


IMAGE = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"messages": USER}, "max_tokens is required"),
        ({"max_tokens": 4}, "messages is required"),
        ({"max_tokens": 4, "messages": []}, "messages must hold at least one message"),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [{"type": "audio"}]}]},
            "audio content blocks are not part of the Anthropic Messages API; "
            "send audio to /v1/chat/completions",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "file"}}]}
                ],
            },
            "image source type must be 'base64' or 'url'",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "user", "content": [IMAGE]}]},
            "model tiny-llama is text-only: 'image' content parts are not supported",
        ),
        (
            {"max_tokens": 4, "messages": [{"role": "system", "content": "x"}]},
            None,
        ),
        (
            {
                "max_tokens": 4,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}],
                    }
                ],
            },
            "tool_use blocks belong in assistant turns",
        ),
        (
            {
                "max_tokens": 4,
                "messages": [
                    USER[0],
                    {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
                ],
            },
            "tool_result blocks belong in user turns",
        ),
        ({"max_tokens": 0, "messages": USER}, None),
        ({"max_tokens": 4, "messages": USER, "tool_choice": {"type": "tool"}}, None),
        ({"max_tokens": 4, "messages": USER, "top_p": 2}, None),
    ],
)
def test_bad_requests_are_anthropic_400s(
    client: httpx.Client, body: dict, message: str | None
) -> None:
    assert_error(client.post(MESSAGES, json=body), 400, "invalid_request_error", message)


def test_image_inside_a_tool_result_names_the_model(client: httpx.Client) -> None:
    messages = [
        {"role": "user", "content": "shot?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t", "name": "s", "input": {}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t", "content": [IMAGE]}],
        },
    ]
    r = client.post(MESSAGES, json={"max_tokens": 2, "messages": messages})
    message = "model tiny-llama is text-only: 'image' content parts are not supported"
    assert_error(r, 400, "invalid_request_error", message)


def test_protocol_level_errors(client: httpx.Client) -> None:
    r = client.post(MESSAGES, content=b"{not json", headers={"content-type": "application/json"})
    assert_error(r, 400, "invalid_request_error", "invalid JSON body")
    r = client.post(COUNT, content=b"[]", headers={"content-type": "application/json"})
    assert_error(r, 400, "invalid_request_error")
    r = client.post(MESSAGES, content=b"x", headers={"content-type": "text/plain"})
    assert_error(r, 415, "invalid_request_error")
    assert_error(client.get(MESSAGES), 405, "invalid_request_error", "method not allowed")
    assert_error(client.post("/v1/messages/batches", json={}), 404, "not_found_error", "not found")
    long = [{"role": "user", "content": "word " * 300}]
    r = client.post(MESSAGES, json={"max_tokens": 4, "messages": long})
    assert_error(r, 400, "invalid_request_error")
    assert "maximum context length is 256 tokens" in r.json()["error"]["message"]


def test_sdk_raises_typed_errors(sdk: anthropic.Anthropic) -> None:
    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.messages.create(model="x", max_tokens=0, messages=USER)
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "Invalid value for 'max_tokens': 0 is less than the minimum of 1",
        },
    }


def test_sdk_with_a_keyed_server(tiny_engine) -> None:
    """With ``--api-key`` the SDK's ``x-api-key`` must be the key; a wrong one is
    an Anthropic ``authentication_error`` the SDK raises as its typed exception."""
    app = create_app(tiny_engine, ServeConfig(api_key="sk-right"), validate_responses=True)

    async def run(key: str) -> Any:
        http = checking_async_client(
            "http://localhost", http=httpx2, transport=httpx2.ASGITransport(app=app), timeout=60
        )
        async with anthropic.AsyncAnthropic(
            base_url="http://localhost", api_key=key, max_retries=0, http_client=http
        ) as sdk:
            return await sdk.messages.count_tokens(model="m", messages=USER)

    assert asyncio.run(run("sk-right")).input_tokens == 21
    with pytest.raises(anthropic.AuthenticationError) as caught:
        asyncio.run(run("sk-wrong"))
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid API key"},
    }
    assert caught.value.response.headers["www-authenticate"] == "Bearer"


def test_anthropic_headers_are_accepted(client: httpx.Client) -> None:
    headers = {"x-api-key": "sk-anything", "anthropic-version": "2023-06-01"}
    r = client.post(MESSAGES, json={"messages": USER, "max_tokens": 1}, headers=headers)
    assert r.status_code == 200
    r = client.post(COUNT, json={"model": "x", "messages": USER}, headers=headers)
    assert r.json() == {"input_tokens": 21}

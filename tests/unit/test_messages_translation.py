"""Pure tests of the Anthropic surface: the request translation
(:func:`mlxspec.handlers.messages.anthropic.to_chat_body`), the reply rendering and the
stream's block grammar on scripted chat events (no model)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from mlxspec.engine import Finished
from mlxspec.handlers.messages.anthropic import to_chat_body
from mlxspec.handlers.messages.messages import (
    BlockWriter,
    anthropic_usage,
    message_body,
    stop_fields,
    tool_use_id,
)
from mlxspec.handlers.turns.parser import (
    ChatTurn,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    TurnEnd,
)

USER = {"role": "user", "content": "hi"}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 8, "messages": [USER], **fields}


# --- request translation ---------------------------------------------------------


def test_minimal_body() -> None:
    assert to_chat_body(body()) == {"messages": [USER], "max_tokens": 8}


def test_system_string_and_blocks() -> None:
    assert to_chat_body(body(system="be brief"))["messages"] == [
        {"role": "system", "content": "be brief"},
        USER,
    ]
    blocks = [{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}]
    blocks.append({"type": "text", "text": "b"})
    assert to_chat_body(body(system=blocks))["messages"][0] == {
        "role": "system",
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }
    assert to_chat_body(body(system=""))["messages"] == [USER]
    assert to_chat_body(body(system=[]))["messages"] == [USER]


def test_tool_use_and_tool_result_round_trip() -> None:
    messages = [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "two calls", "signature": "sig"},
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "toolu_2",
                    "name": "get_weather",
                    "input": {"city": "Rome"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "21C"}],
                    "is_error": False,
                },
                {"type": "text", "text": "Which is warmer?"},
            ],
        },
    ]
    assert to_chat_body(body(messages=messages))["messages"] == [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Checking."}],
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": [{"type": "text", "text": "21C"}]},
        {"role": "user", "content": [{"type": "text", "text": "Which is warmer?"}]},
    ]


def test_tool_only_turns() -> None:
    messages = [
        USER,
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_9", "name": "now", "input": {}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9"}]},
    ]
    assert to_chat_body(body(messages=messages))["messages"][1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "toolu_9",
                    "type": "function",
                    "function": {"name": "now", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_9", "content": ""},
    ]


def test_thinking_only_assistant_turn_keeps_an_empty_turn() -> None:
    thinking = {"type": "redacted_thinking", "data": "x"}
    messages = [USER, {"role": "assistant", "content": [thinking]}, USER]
    assert to_chat_body(body(messages=messages))["messages"] == [
        USER,
        {"role": "assistant", "content": ""},
        USER,
    ]


def test_images_and_unknown_blocks_pass_through_under_their_own_type() -> None:
    content = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA="}},
        {"type": "image", "source": {"type": "url", "url": "https://x/cat.jpg"}},
        {"type": "document", "source": {"type": "text", "data": "doc"}},
    ]
    chat = to_chat_body(body(messages=[{"role": "user", "content": content}]))
    assert chat["messages"] == [{"role": "user", "content": content}]


def test_tools_map_to_functions_and_server_tools_are_dropped() -> None:
    tools = [
        {"name": "get_weather", "description": "Weather.", "input_schema": WEATHER_SCHEMA},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"type": "custom", "name": "ping", "input_schema": {"type": "object"}},
    ]
    assert to_chat_body(body(tools=tools))["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": WEATHER_SCHEMA,
                "description": "Weather.",
            },
        },
        {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}},
    ]
    assert "tools" not in to_chat_body(body(tools=[tools[1]]))


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, {"tool_choice": "auto"}),
        ({"type": "any"}, {"tool_choice": "required"}),
        ({"type": "none"}, {"tool_choice": "none"}),
        (
            {"type": "tool", "name": "get_weather"},
            {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}},
        ),
        (
            {"type": "auto", "disable_parallel_tool_use": True},
            {"tool_choice": "auto", "parallel_tool_calls": False},
        ),
        ({"type": "any", "disable_parallel_tool_use": False}, {"tool_choice": "required"}),
    ],
)
def test_tool_choice(choice: dict, expected: dict) -> None:
    assert to_chat_body(body(tool_choice=choice)) == {
        "messages": [USER],
        "max_tokens": 8,
        **expected,
    }


def test_sampling_extras_session_and_ignored_fields() -> None:
    sampling = {
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 7,
        "min_p": 0.05,
        "xtc_probability": 0.1,
        "xtc_threshold": 0.2,
        "repetition_penalty": 1.1,
        "repetition_context_size": 30,
        "presence_penalty": 0.3,
        "presence_context_size": 10,
        "frequency_penalty": 0.4,
        "frequency_context_size": 12,
        "session_id": "agent-42",
        "prompt_cache_key": "k",
    }
    ignored = {
        "logit_bias": {"2": -100},
        "metadata": {"user_id": "u"},
        "stream": True,
        "service_tier": "auto",
    }
    chat = to_chat_body(body(**sampling, **ignored, stop_sequences=["\n\n", "END"]))
    assert chat == {
        "messages": [USER],
        "max_tokens": 8,
        **sampling,
        "stop": ["\n\n", "END"],
    }
    nulls = to_chat_body(body(temperature=None, top_k=None, stop_sequences=None, tools=None))
    assert nulls == {"messages": [USER], "max_tokens": 8}


@pytest.mark.parametrize(
    ("kind", "enabled"), [("enabled", True), ("adaptive", True), ("disabled", False)]
)
def test_thinking_sets_enable_thinking(kind: str, enabled: bool) -> None:
    # an enabled budget must be below max_tokens (Anthropic's rule)
    chat = to_chat_body(body(max_tokens=2048, thinking={"type": kind, "budget_tokens": 1024}))
    assert chat["chat_template_kwargs"] == {"enable_thinking": enabled}


def test_translation_does_not_mutate_the_body() -> None:
    original = body(
        system=[{"type": "text", "text": "s"}],
        messages=[
            USER,
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"a": [1]}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t", "content": "ok"}],
            },
        ],
        tools=[{"name": "f", "input_schema": {"type": "object"}}],
        tool_choice={"type": "auto"},
    )
    snapshot = copy.deepcopy(original)
    to_chat_body(original)
    assert original == snapshot


# --- reply rendering ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("finish", "stop", "expected"),
    [
        ("stop", None, ("end_turn", None)),
        ("stop", "\n\n", ("stop_sequence", "\n\n")),
        ("length", None, ("max_tokens", None)),
        ("tool_calls", None, ("tool_use", None)),
        # A stop string that ended a tool-call turn is not the reason it ended.
        ("tool_calls", "##", ("tool_use", None)),
    ],
)
def test_stop_fields(finish: str, stop: str | None, expected: tuple) -> None:
    fields = stop_fields(finish, Finished("stop", 3, 1, stop_sequence=stop))
    assert (fields["stop_reason"], fields["stop_sequence"]) == expected


def test_usage_splits_cached_prompt_tokens() -> None:
    assert anthropic_usage(Finished("stop", 30, 5)) == {"input_tokens": 30, "output_tokens": 5}
    assert anthropic_usage(Finished("stop", 30, 5, cached_tokens=24)) == {
        "input_tokens": 6,
        "output_tokens": 5,
        "cache_read_input_tokens": 24,
    }


HEAD = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m"}


def test_message_body_orders_thinking_text_tool_use() -> None:
    turn = ChatTurn(
        content="Let me check.",
        reasoning="need weather",
        tool_calls=[ToolCall("call_ab12", "get_weather", '{"city": "Paris"}')],
        finish_reason="tool_calls",
        finished=Finished("stop", 20, 9),
    )
    assert message_body(HEAD, turn) == {
        **HEAD,
        "content": [
            {"type": "thinking", "thinking": "need weather", "signature": ""},
            {"type": "text", "text": "Let me check."},
            {
                "type": "tool_use",
                "id": "toolu_ab12",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 9},
    }


def test_message_body_empty_reply_and_stop_sequence() -> None:
    turn = ChatTurn(content="", finished=Finished("stop", 4, 1, stop_sequence="##"))
    out = message_body(HEAD, turn)
    assert out["content"] == []
    assert (out["stop_reason"], out["stop_sequence"]) == ("stop_sequence", "##")


def test_tool_use_id() -> None:
    assert tool_use_id("call_9f8e") == "toolu_9f8e"
    assert tool_use_id("abc") == "toolu_abc"


def test_block_writer_on_scripted_events() -> None:
    """Thinking, text and two tool calls: blocks open and close in order, and
    argument fragments become input_json_delta on their own block."""
    events = [
        ReasoningDelta("plan"),
        TextDelta(""),  # logprobs-only delta: no block
        TextDelta("Sure."),
        TextDelta(" Two"),
        ToolCallStart(0, "call_a", "get_weather"),
        ToolCallArguments(0, '{"city": '),
        ToolCallArguments(0, '"Paris"}'),
        ToolCallStart(1, "call_b", "get_time"),
        ToolCallArguments(1, ""),
        TurnEnd("tool_calls", Finished("stop", 12, 30)),
    ]
    writer = BlockWriter()
    out = [payload for event in events for payload in writer.feed(event)]

    def delta(index: int, kind: str, field: str, value: str) -> dict:
        return {
            "type": "content_block_delta",
            "index": index,
            "delta": {"type": kind, field: value},
        }

    assert out == [
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "thinking", "thinking": "", "signature": ""},
        },
        delta(0, "thinking_delta", "thinking", "plan"),
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": {"type": "text", "text": ""}},
        delta(1, "text_delta", "text", "Sure."),
        delta(1, "text_delta", "text", " Two"),
        {"type": "content_block_stop", "index": 1},
        {
            "type": "content_block_start",
            "index": 2,
            "content_block": {
                "type": "tool_use",
                "id": "toolu_a",
                "name": "get_weather",
                "input": {},
            },
        },
        delta(2, "input_json_delta", "partial_json", '{"city": '),
        delta(2, "input_json_delta", "partial_json", '"Paris"}'),
        {"type": "content_block_stop", "index": 2},
        {
            "type": "content_block_start",
            "index": 3,
            "content_block": {"type": "tool_use", "id": "toolu_b", "name": "get_time", "input": {}},
        },
        {"type": "content_block_stop", "index": 3},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {"input_tokens": 12, "output_tokens": 30},
        },
        {"type": "message_stop"},
    ]
    joined = "".join(p["delta"]["partial_json"] for p in out[8:10])
    assert json.loads(joined) == {"city": "Paris"}


def test_block_writer_empty_turn_has_no_blocks() -> None:
    out = BlockWriter().feed(TurnEnd("length", Finished("length", 3, 4)))
    assert [p["type"] for p in out] == ["message_delta", "message_stop"]
    assert out[0]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}

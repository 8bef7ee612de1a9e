"""The Anthropic betas current clients send, translated (pure): system turns
inside ``messages`` (``mid-conversation-system-2026-04-07``), mid-conversation
tool changes, deferred tools, and the wrapping of system turns for templates
that refuse them. ``tests/api/test_messages_betas.py`` sends them over HTTP."""

from __future__ import annotations

from typing import Any

import pytest

from mlxspec.engine.system_turns import inline_system_turns
from mlxspec.errors import ApiError
from mlxspec.handlers.messages.anthropic import to_chat_body

USER = {"role": "user", "content": "hi"}
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}


def body(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 8, "messages": messages, **fields}


def tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": name, "input_schema": SCHEMA, **extra}


def names(chat: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in chat.get("tools", [])]


def test_system_turns_stand_where_they_are() -> None:
    chat = to_chat_body(
        body(
            [
                USER,
                {"role": "system", "content": [{"type": "text", "text": "agents: a, b"}]},
                {"role": "assistant", "content": "ok"},
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "go"},
            ],
            system="top",
        )
    )
    assert chat["messages"] == [
        {"role": "system", "content": "top"},
        USER,
        {"role": "system", "content": "agents: a, b"},
        {"role": "assistant", "content": "ok"},
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "go"},
    ]


def test_system_turns_alone_have_nothing_to_answer() -> None:
    with pytest.raises(ApiError, match="only system turns"):
        to_chat_body(body([{"role": "system", "content": "x"}]))


def test_clear_at_and_output_config_only_system_turns() -> None:
    clears = {"role": "system", "content": "once", "clear_at": "next_user_message"}
    effort = {"role": "system", "output_config": {"effort": "high"}}
    shown = to_chat_body(body([USER, clears]))["messages"]
    assert shown == [USER, {"role": "system", "content": "once"}]
    later = to_chat_body(body([USER, clears, {"role": "assistant", "content": "a"}, USER, effort]))
    assert later["messages"] == [USER, {"role": "assistant", "content": "a"}, USER]


def test_tool_pairs_see_through_system_turns() -> None:
    use = {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "t1", "content": "x"}
    messages = [
        USER,
        {"role": "assistant", "content": [use]},
        {"role": "system", "content": "reminder"},
        {"role": "user", "content": [result]},
    ]
    chat = to_chat_body(body(messages, tools=[tool("Read")]))
    assert [m["role"] for m in chat["messages"]] == ["user", "assistant", "system", "tool"]
    with pytest.raises(ApiError, match="without a tool_result"):
        to_chat_body(body(messages[:3] + [USER], tools=[tool("Read")]))


def test_deferred_tools_load_when_a_tool_search_finds_them() -> None:
    tools = [tool("Read"), tool("Cron", defer_loading=True), tool("Web", defer_loading=True)]
    assert names(to_chat_body(body([USER], tools=tools))) == ["Read"]
    found = {
        "type": "tool_result",
        "tool_use_id": "s1",
        "content": [{"type": "tool_reference", "tool_name": "Web"}],
    }
    search = {"type": "tool_use", "id": "s1", "name": "Read", "input": {}}
    messages = [
        USER,
        {"role": "assistant", "content": [search]},
        {"role": "user", "content": [found]},
    ]
    chat = to_chat_body(body(messages, tools=tools))
    assert names(chat) == ["Read", "Web"]
    assert chat["messages"][-1]["content"] == [{"type": "text", "text": "Tool loaded: Web"}]


def test_tool_additions_and_removals_apply_in_order() -> None:
    tools = [tool("Read"), tool("Edit"), tool("Cron", defer_loading=True)]

    def change(kind: str, name: str) -> dict[str, Any]:
        return {"type": kind, "tool": {"type": "tool_reference", "name": name}}

    inline = {"type": "tool_definition", "definition": tool("Inline")}
    system = {
        "role": "system",
        "content": [
            change("tool_addition", "Cron"),
            change("tool_removal", "Edit"),
            {"type": "tool_addition", "tool": inline},
            {
                "type": "tool_addition",
                "tool": {"type": "mcp_toolset_reference", "server_name": "s"},
            },
        ],
    }
    chat = to_chat_body(body([USER, system], tools=tools))
    assert names(chat) == ["Read", "Cron", "Inline"]
    assert chat["messages"] == [USER]  # a system turn of tool changes only renders nothing


def test_inline_system_turns_joins_the_nearest_user_turn() -> None:
    first = {"role": "system", "content": "S"}
    after_user = [first, USER, {"role": "system", "content": "A"}]
    assert inline_system_turns(after_user) == [
        first,
        {"role": "user", "content": "hi\n\n<system>\nA\n</system>"},
    ]
    before_user = [USER, {"role": "assistant", "content": "r"}, {"role": "system", "content": "B"}]
    before_user.append({"role": "user", "content": "u"})
    assert inline_system_turns(before_user)[2:] == [
        {"role": "user", "content": "<system>\nB\n</system>\n\nu"}
    ]
    alone = [USER, {"role": "assistant", "content": "r"}, {"role": "system", "content": "C"}]
    assert inline_system_turns(alone)[2:] == [{"role": "user", "content": "<system>\nC\n</system>"}]

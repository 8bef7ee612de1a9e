"""The Anthropic betas current clients send: system turns inside ``messages``
(``mid-conversation-system-2026-04-07``), mid-conversation tool changes, deferred
tools, and the request fields Claude Code and the ``anthropic`` 2.x SDK add
(``context_management``, ``cache_control``, ``output_config``, ``speed``, ...).

Translation tests are pure; the HTTP ones run on the tiny live server through a
client that checks every answer against the document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from fixtures.tiny_model import build_tiny_llama
from mlxspec.engine.prompt import inline_system_turns, render_chat
from mlxspec.errors import ApiError
from mlxspec.handlers.messages.anthropic import to_chat_body

USER = {"role": "user", "content": "hi"}
SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}}
MESSAGES, COUNT = "/v1/messages", "/v1/messages/count_tokens"


def body(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 8, "messages": messages, **fields}


def tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "description": name, "input_schema": SCHEMA, **extra}


def names(chat: dict[str, Any]) -> list[str]:
    return [t["function"]["name"] for t in chat.get("tools", [])]


# --- translation -----------------------------------------------------------------


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


# --- a template that refuses a system turn after the first message -----------------

STRICT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


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


def test_a_strict_template_gets_system_turns_inside_user_turns(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    folder = build_tiny_llama(tmp_path / "strict", chat_template=STRICT_TEMPLATE)
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    messages = [USER, {"role": "system", "content": "agents"}]
    tokens = render_chat(tokenizer, messages)
    assert tokenizer.decode(tokens) == (
        "<|im_start|>user\nhi\n\n<system>\nagents\n</system><|im_end|>\n<|im_start|>assistant\n"
    )
    # a leading system turn is the template's to render
    lead = render_chat(tokenizer, [{"role": "system", "content": "s"}, USER])
    assert tokenizer.decode(lead).startswith("<|im_start|>system\ns<|im_end|>")


# --- over HTTP ---------------------------------------------------------------------

#: Fields Claude Code 2.1 and the anthropic 2.x SDK send on ``/v1/messages?beta=true``.
BETA_FIELDS = {
    "thinking": {"type": "adaptive", "display": "omitted"},
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "medium", "task_budget": {"type": "tokens", "total": 1000}},
    "metadata": {"user_id": '{"device_id":"d","session_id":"s"}'},
    "speed": "standard",
    "service_tier": "auto",
    "container": {"id": None, "skills": []},
    "diagnostics": {"request_id": "r"},
    "inference_geo": "us",
    "cache_control": {"type": "ephemeral"},
    "mcp_servers": [],
}


def claude_code_body(**fields: Any) -> dict[str, Any]:
    """The shape of Claude Code's first request (its prompt cut short)."""
    system = [
        {"type": "text", "text": "x-billing: 2.1"},
        {"type": "text", "text": "Agent.", "cache_control": {"type": "ephemeral"}},
    ]
    reminder = {"type": "text", "text": "<r>x</r>"}
    messages = [
        {"role": "user", "content": [reminder, {"type": "text", "text": "hi"}]},
        {"role": "system", "content": [{"type": "text", "text": "Agents", "cache_control": None}]},
    ]
    small = {"type": "object"}
    tools = [
        {"name": "R", "input_schema": small, "cache_control": {"type": "ephemeral"}},
        {"name": "Deferred", "input_schema": small, "defer_loading": True},
    ]
    return body(messages, system=system, tools=tools, **BETA_FIELDS, **fields)


def test_claude_code_shaped_request(client: httpx.Client) -> None:
    r = client.post(f"{MESSAGES}?beta=true", json=claude_code_body(temperature=0))
    assert r.status_code == 200, r.text
    assert r.json()["type"] == "message"
    count = client.post(f"{COUNT}?beta=true", json=claude_code_body())
    assert count.status_code == 200, count.text
    assert count.json()["input_tokens"] == r.json()["usage"]["input_tokens"]


def test_claude_code_shaped_stream(client: httpx.Client) -> None:
    with client.stream("POST", MESSAGES, json=claude_code_body(stream=True)) as r:
        assert r.status_code == 200
        text = "".join(r.iter_text())
    assert text.startswith("event: message_start\n")
    assert "event: message_stop\n" in text


@pytest.mark.parametrize(
    ("message", "error"),
    [
        (
            {
                "role": "system",
                "content": [{"type": "tool_use", "id": "t", "name": "n", "input": {}}],
            },
            "system messages hold text, tool_addition and tool_removal blocks only",
        ),
        ({"role": "system"}, "a system message needs content or output_config"),
        ({"role": "system", "content": ""}, "every message needs content"),
        (
            {"role": "user", "content": [{"type": "tool_removal", "tool": {"type": "x"}}]},
            "tool_addition and tool_removal blocks belong in system turns",
        ),
    ],
)
def test_bad_system_turns_are_400s(client: httpx.Client, message: dict, error: str) -> None:
    r = client.post(MESSAGES, json=body([USER, message]))
    assert r.status_code == 400, r.text
    assert error in r.json()["error"]["message"]

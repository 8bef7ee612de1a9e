"""The Anthropic betas current clients send, over HTTP on the tiny live server:
Claude Code's request shape (a system turn inside ``messages``, ``cache_control``,
deferred tools and the beta fields of Claude Code 2.1 and the ``anthropic`` 2.x
SDK), their 400s, and a chat template that refuses a system turn after the first
message. ``client`` checks every answer against the document."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from fixtures.tiny_model import build_tiny_llama
from mlxspec.engine.prompt import render_chat

USER = {"role": "user", "content": "hi"}
MESSAGES, COUNT = "/v1/messages", "/v1/messages/count_tokens"


def body(messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {"model": "claude-x", "max_tokens": 8, "messages": messages, **fields}


# --- a template that refuses a system turn after the first message -----------------

STRICT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m.role == 'system' and not loop.first %}"
    "{{ raise_exception('System message must be at the beginning.') }}{% endif %}"
    "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


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

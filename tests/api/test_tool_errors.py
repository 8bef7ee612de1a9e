"""A failed tool result reaches the prompt as a failure (issue 25, item 11):
Anthropic's ``tool_result.is_error`` (and the same flag on a chat ``tool``
message) is the template's own field where it reads one, else the result's
text starts with ``Error: ``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from fixtures.template_families import FAMILIES, load_family
from mlxspec.engine.prompt import normalize_messages, render_chat
from mlxspec.engine.prompt_messages import TOOL_ERROR_MARKER, mark_tool_errors
from mlxspec.engine.template_sandbox import TemplateBudget
from mlxspec.handlers.messages.anthropic import to_chat_body

USE = {"type": "tool_use", "id": "tu_1", "name": "lookup", "input": {"q": "x"}}
TOOLS = [{"name": "lookup", "input_schema": {"type": "object"}}]


def _anthropic(is_error: bool | None) -> dict[str, Any]:
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": "tu_1", "content": "boom"}
    if is_error is not None:
        result["is_error"] = is_error
    return {
        "model": "x",
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": "look x up"},
            {"role": "assistant", "content": [USE]},
            {"role": "user", "content": [result]},
        ],
    }


def test_the_flag_reaches_the_tool_message() -> None:
    tool = [m for m in to_chat_body(_anthropic(True))["messages"] if m["role"] == "tool"]
    assert tool == [{"role": "tool", "tool_call_id": "tu_1", "content": "boom", "is_error": True}]
    tool = [m for m in to_chat_body(_anthropic(False))["messages"] if m["role"] == "tool"]
    assert "is_error" not in tool[0]


def test_a_template_without_the_field_gets_the_marker() -> None:
    messages = [
        {"role": "tool", "tool_call_id": "a", "content": "boom", "is_error": True},
        {"role": "tool", "tool_call_id": "b", "content": "fine", "is_error": False},
    ]
    out = mark_tool_errors(messages, "{{ messages }}")
    assert out == [
        {"role": "tool", "tool_call_id": "a", "content": "Error: boom"},
        {"role": "tool", "tool_call_id": "b", "content": "fine"},
    ]
    assert messages[0]["content"] == "boom"  # not mutated
    own = "{{ tools }}{% for m in messages %}{% if m.is_error %}FAILED {% endif %}{% endfor %}"
    assert mark_tool_errors(messages, own) == messages


def test_a_template_that_reads_is_error_renders_it(tmp_path: Path) -> None:
    tok = load_family(tmp_path, FAMILIES[0])
    own = (
        "{{ tools | length if tools else '' }}{% for m in messages %}"
        "{% if m.is_error %}FAILED {% endif %}{{ m.content }};{% endfor %}"
    )
    messages = [{"role": "tool", "tool_call_id": "a", "content": "boom", "is_error": True}]
    kwargs = {"chat_template": own}
    ids = render_chat(tok, normalize_messages(messages, "m"), template_kwargs=kwargs,
                      budget=TemplateBudget())  # fmt: skip
    assert tok.decode(ids) == "FAILED boom;"


def test_the_model_reads_the_failure(tmp_path: Path) -> None:
    tok = load_family(tmp_path, FAMILIES[0])  # ChatML, no tools: results as <tool_response>
    chat = to_chat_body(_anthropic(True))
    text = tok.decode(render_chat(tok, normalize_messages(chat["messages"], "m")))
    assert f"<tool_response>\n{TOOL_ERROR_MARKER}boom\n</tool_response>" in text


@pytest.mark.parametrize("surface", ["messages", "chat"])
def test_a_failed_result_costs_the_marker_tokens(client: httpx.Client, surface: str) -> None:
    counts = {}
    for flag in (None, False, True):
        if surface == "messages":
            r = client.post("/v1/messages/count_tokens", json=_anthropic(flag))
            assert r.status_code == 200, r.text
            counts[flag] = r.json()["input_tokens"]
        else:
            body = to_chat_body(_anthropic(flag))
            body = {"messages": body["messages"], "max_tokens": 1}  # 256-token context
            r = client.post("/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            counts[flag] = r.json()["usage"]["prompt_tokens"]
    assert counts[None] == counts[False]
    assert counts[True] > counts[False]


def test_a_non_boolean_flag_is_a_400(client: httpx.Client) -> None:
    body = to_chat_body(_anthropic(True))
    body["messages"][-1]["is_error"] = "yes"
    r = client.post("/v1/chat/completions", json={"messages": body["messages"], "max_tokens": 1})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages[2].is_error"

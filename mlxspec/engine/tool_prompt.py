"""Tools for a chat template that does not render them: the definitions as a
system instruction, calls and results in the history as text (the Hermes
``<tool_call>`` convention, which the hermes parser reads back)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

__all__ = [
    "TOOL_INSTRUCTION",
    "template_renders_tools",
    "with_tool_history",
    "with_tool_instruction",
]


def template_renders_tools(template: Any) -> bool:
    """Whether a chat template reads the ``tools`` variable at all (a template
    that does not would silently drop the request's tool definitions).

    Args:
        template: the tokenizer's ``chat_template`` (a string, or a list/dict of
            named templates as some tokenizer configs store them).
    """
    return "tools" in str(template)


#: The instruction that carries tools to a model whose template ignores them:
#: the Hermes ``<tool_call>`` convention, which the hermes parser then reads.
TOOL_INSTRUCTION = (
    "Functions you may call:\n{tools}\n"
    'To call one, reply <tool_call>{{"name":...,"arguments":{{...}}}}</tool_call>'
)


def with_tool_instruction(messages: list[dict], tools: list) -> list[dict]:
    """``messages`` with the tool definitions described in the leading system
    message (merged into an existing one), for templates that do not render
    ``tools`` (llama.cpp's server does the same for such templates).

    Args:
        messages (list[dict]): normalized chat messages.
        tools (list): OpenAI tool definitions.

    Returns:
        list[dict]: a new list; ``messages`` is not mutated.
    """
    described = [t.get("function", t) for t in tools]
    listed = json.dumps(described, ensure_ascii=False, separators=(",", ":"))
    text = TOOL_INSTRUCTION.format(tools=listed)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def with_tool_history(messages: list[dict]) -> list[dict]:
    """``messages`` with tool calls and tool results written as text, for
    templates that do not render ``tools`` (and so neither ``tool_calls`` nor
    ``tool`` turns) and would otherwise show a calling assistant turn empty.

    Each assistant call becomes ``<tool_call>{"name": ..., "arguments": {...}}
    </tool_call>`` (one line per call, after the turn's text), the syntax
    :data:`TOOL_INSTRUCTION` teaches and the hermes parser reads. A run of
    ``tool`` messages becomes one ``user`` turn holding each result as
    ``<tool_response>\\n...\\n</tool_response>``, as Qwen 2.5's template
    renders them: such a template may not know a ``tool`` role at all.

    Args:
        messages (list[dict]): normalized chat messages.

    Returns:
        list[dict]: a new list; ``messages`` is not mutated.
    """
    out: list[dict] = []
    previous = None
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = [_call_text(call) for call in message["tool_calls"]]
            text = "\n".join([message["content"], *calls] if message["content"] else calls)
            out.append({k: v for k, v in message.items() if k != "tool_calls"} | {"content": text})
        elif role == "tool":
            result = _wrapped(message["content"], "<tool_response>\n", "\n</tool_response>")
            if previous == "tool":  # parallel calls' results share one turn
                out[-1]["content"] = _joined(out[-1]["content"], result)
            else:
                out.append({"role": "user", "content": result})
        else:
            out.append(message)
        previous = role
    return out


def _wrapped(content: Any, before: str, after: str) -> Any:
    """``content`` (text, or a list of parts holding media) between two texts."""
    if isinstance(content, list):
        return [{"type": "text", "text": before}, *content, {"type": "text", "text": after}]
    return f"{before}{content}{after}"


def _joined(first: Any, second: Any) -> Any:
    """Two contents as one, a newline between (a list when either holds media)."""
    if isinstance(first, str) and isinstance(second, str):
        return first + "\n" + second
    as_list = [c if isinstance(c, list) else [{"type": "text", "text": c}] for c in (first, second)]
    return [*as_list[0], {"type": "text", "text": "\n"}, *as_list[1]]


def _call_text(call: Mapping[str, Any]) -> str:
    function = call.get("function") or {}
    body = {"name": function.get("name"), "arguments": function.get("arguments", {})}
    return f"<tool_call>{json.dumps(body, ensure_ascii=False)}</tool_call>"

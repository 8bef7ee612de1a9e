"""Which of a Messages request's tools the model is offered.

Anthropic's betas let a conversation change its tools as it goes: a tool with
``defer_loading: true`` is not in the context until a tool search finds it (a
``tool_reference`` block in a ``tool_result``; "Tool search tool"), and a
``system`` turn may hold ``tool_addition`` and ``tool_removal`` blocks (the
``mid-conversation-tool-changes`` beta, which Claude Code sends). A chat
template renders one tool list, before the conversation, so the changes are
applied in order and the tools left at the end are the ones offered
(``docs/deviations.md``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def offered_tools(
    tools: Sequence[Mapping[str, Any]], messages: Sequence[Mapping[str, Any]]
) -> list[Mapping[str, Any]]:
    """The client tools the model sees, as Anthropic tool objects.

    Args:
        tools (Sequence[Mapping]): the request's ``tools``, validated.
        messages (Sequence[Mapping]): the request's ``messages``, validated.

    Returns:
        list[Mapping]: the tools with both ``name`` and ``input_schema`` (server
        tools are dropped), without deferred ones until something loads them,
        with ``tool_addition`` ones added (a ``tool_definition`` at the end) and
        ``tool_removal`` ones taken out, in request order.
    """
    declared = {t["name"]: t for t in tools if "name" in t and "input_schema" in t}
    offered = {name: t for name, t in declared.items() if not t.get("defer_loading")}
    for message in messages:
        content = message["content"] if "content" in message else ()
        for block in content if not isinstance(content, str) else ():
            kind = block["type"]
            if kind == "tool_result":
                for name in _references(block):
                    if name in declared:
                        offered.setdefault(name, declared[name])
            elif kind == "tool_addition":
                tool = _addition(block["tool"], declared)
                if tool is not None:
                    offered[tool["name"]] = tool
            elif kind == "tool_removal" and block["tool"].get("type") == "tool_reference":
                offered.pop(block["tool"].get("name"), None)
    order = list(declared)
    return sorted(offered.values(), key=lambda t: _rank(order, t["name"]))


def _references(result: Mapping[str, Any]) -> list[str]:
    """The tool names a tool result's ``tool_reference`` blocks load."""
    inner = result.get("content")
    if not isinstance(inner, list):
        return []
    return [
        item["tool_name"]
        for item in inner
        if item.get("type") == "tool_reference" and isinstance(item.get("tool_name"), str)
    ]


def _addition(
    tool: Mapping[str, Any], declared: Mapping[str, Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The tool a ``tool_addition`` block offers: a declared one by name, or an
    inline definition; MCP references name nothing this server runs."""
    if tool.get("type") == "tool_reference":
        return declared.get(tool.get("name"))  # type: ignore[arg-type]
    if tool.get("type") == "tool_definition":
        definition = tool.get("definition")
        if (
            isinstance(definition, Mapping)
            and "name" in definition
            and "input_schema" in definition
        ):
            return definition
    return None


def _rank(order: list[str], name: str) -> int:
    return order.index(name) if name in order else len(order)

"""Grammars that force a tool call (``tool_choice: "required"`` or a named function).

The constraint is an xgrammar structural tag in the model's own tool-call
syntax, so the forced output parses with the same tool parser. xgrammar ships
the tags for the Hermes/Qwen JSON, Qwen XML and Llama 3 JSON formats
(``get_model_structural_tag``); the Mistral JSON list is built here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from mlxspec.engine.types import Constraint
from mlxspec.parsers import tool_parser_class

log = logging.getLogger("mlxspec.parsers")

#: Most whitespace characters the grammar allows at one place inside the
#: arguments JSON: enough for pretty-printing, too few for a weak model to
#: spend its whole budget on spaces.
MAX_WHITESPACE = 16

#: What separates parallel forced calls, by xgrammar model format (default
#: ``"\n"``): Llama 3 templates ask for ``;`` between JSON calls.
CALL_SEPARATORS = {"llama": ";"}

#: Formats whose calls can be forced.
FORCEABLE = ("hermes", "qwen3_coder", "llama3_json", "mistral")


def forced_tools(tools: Sequence[Mapping[str, Any]], tool_choice: Any) -> list[Mapping[str, Any]]:
    """The tools a forcing ``tool_choice`` allows: all, or the one it names."""
    if isinstance(tool_choice, Mapping):
        name = (tool_choice.get("function") or {}).get("name")
        return [t for t in tools if (t.get("function") or {}).get("name") == name]
    return list(tools)


def tool_call_constraint(
    parser: str,
    tools: Sequence[Mapping[str, Any]],
    tool_choice: Any,
    parallel_tool_calls: bool = True,
    thinking: bool = False,
) -> Constraint | None:
    """The grammar that makes the model call a tool in ``parser``'s format.

    Args:
        parser (str): a tool parser registry name.
        tools (Sequence[Mapping]): the request's OpenAI function tools.
        tool_choice: ``"required"`` or ``{"type": "function", "function": {"name": ...}}``;
            anything else forces nothing.
        parallel_tool_calls (bool): allow more than one call. Default: ``True``.
        thinking (bool): the output starts inside the thinking channel, which
            runs free until its end marker. Default: ``False``.

    Returns:
        Constraint | None: a ``structural_tag`` constraint, or ``None`` when
        ``tool_choice`` does not force or the format cannot be forced.
    """
    if tool_choice != "required" and not isinstance(tool_choice, Mapping):
        return None
    allowed = forced_tools(tools, tool_choice)
    if parser not in FORCEABLE or not allowed:
        return None
    if parser == "mistral":
        tag = _mistral_tag(allowed, parallel_tool_calls)
    else:
        from xgrammar.builtin_structural_tag import get_model_structural_tag

        model = tool_parser_class(parser).xgrammar_model
        assert model is not None
        try:
            tag = get_model_structural_tag(
                model,
                tools=[dict(t) for t in allowed],
                tool_choice=dict(tool_choice) if isinstance(tool_choice, Mapping) else "required",
                reasoning=thinking,
                parallel_tool_calls=parallel_tool_calls,
                max_whitespace_cnt=MAX_WHITESPACE,
            ).model_dump(mode="json")
        except (ValueError, TypeError):  # pydantic rejects a tool it cannot describe
            log.warning("no forcing grammar for these tools", exc_info=True)
            return None
        tag = _calls_only(tag, CALL_SEPARATORS.get(model, "\n"))
    return Constraint(kind="structural_tag", spec=json.dumps(tag))


def _calls_only(node: Any, separator: str) -> Any:
    """``node`` (a structural tag as JSON) with every ``triggered_tags`` that
    needs a call turned into ``tags_with_separator``: calls joined by
    ``separator`` and nothing else, so the grammar ends after the last call.

    xgrammar's built-in tags for a forced call (``at_least_one``) use
    ``triggered_tags``, which also admits free text once a call is written: with
    parallel calls allowed, a model went on writing prose after its call until
    ``max_tokens`` ran out (``finish_reason: "length"``). A forced turn is only
    tool calls (OpenAI's ``tool_choice: "required"``: the model must call one
    or more tools).
    """
    if isinstance(node, list):
        return [_calls_only(item, separator) for item in node]
    if not isinstance(node, dict):
        return node
    if node.get("type") == "triggered_tags" and node.get("at_least_one"):
        return {
            "type": "tags_with_separator",
            "tags": node["tags"],
            "separator": separator,
            "at_least_one": True,
            "stop_after_first": bool(node.get("stop_after_first")),
        }
    return {key: _calls_only(value, separator) for key, value in node.items()}


def _mistral_tag(tools: Sequence[Mapping[str, Any]], parallel: bool) -> dict[str, Any]:
    """``[TOOL_CALLS][{"name": "f", "arguments": {...}}, ...]`` as a structural tag."""
    tags = []
    for tool in tools:
        function = tool.get("function") or {}
        schema = function.get("parameters") or {"type": "object"}
        begin = '{"name": ' + json.dumps(function.get("name")) + ', "arguments": '
        content = {
            "type": "json_schema",
            "json_schema": schema,
            "max_whitespace_cnt": MAX_WHITESPACE,
        }
        tags.append({"type": "tag", "begin": begin, "content": content, "end": "}"})
    calls = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": ", ",
        "at_least_one": True,
        "stop_after_first": not parallel,
    }
    elements = [
        {"type": "const_string", "value": "[TOOL_CALLS]["},
        calls,
        {"type": "const_string", "value": "]"},
    ]
    return {"type": "structural_tag", "format": {"type": "sequence", "elements": elements}}

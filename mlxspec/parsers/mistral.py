"""Mistral tool calls after ``[TOOL_CALLS]``.

Two shapes: a JSON list ``[{"name": ..., "arguments": {...}}]`` (v3 templates),
parsed incrementally, and ``name[ARGS]{...}`` headers (v11+), parsed with
mlx-lm's ``tool_parsers/mistral.py`` once the output ends. There is no closing
tag: the block runs to the end of the output.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mlx_lm.tool_parsers import mistral

from mlxspec.parsers.base import ParserDelta, ToolParser
from mlxspec.parsers.json_calls import JsonCallsBlock
from mlxspec.parsers.whole import WholeBlock


class MistralBlock:
    """Chooses the JSON reader or the header parser from the first character."""

    def __init__(self, tools: Sequence[Mapping[str, Any]]) -> None:
        self.tools = tools
        self.head = ""
        self.inner: JsonCallsBlock | WholeBlock | None = None

    def feed(self, text: str) -> list[ParserDelta]:
        """Read more of the block."""
        if self.inner is None:
            self.head += text
            stripped = self.head.lstrip()
            if not stripped:
                return []
            json_list = stripped[0] in "[{"
            self.inner = (
                JsonCallsBlock(self.tools) if json_list else WholeBlock(self.tools, _parse_headers)
            )
            text = self.head
        return self.inner.feed(text)

    def close(self) -> list[ParserDelta] | None:
        """Finish the block (``None``: no call in it)."""
        return self.inner.close() if self.inner is not None else None


def _parse_headers(text: str, tools: list) -> Any:
    return mistral.parse_tool_call(text.replace(MistralToolParser.start, " "), tools)


class MistralToolParser(ToolParser):
    """``[TOOL_CALLS]`` followed by calls, to the end of the output."""

    name = "mistral"
    start = "[TOOL_CALLS]"
    end = ""

    def open_block(self) -> MistralBlock:
        return MistralBlock(self.tools)

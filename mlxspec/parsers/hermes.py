"""Hermes / Qwen 2.5-3 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``."""

from __future__ import annotations

from mlxspec.parsers.base import ToolParser
from mlxspec.parsers.json_calls import JsonCallsBlock


class HermesToolParser(ToolParser):
    """JSON envelopes inside ``<tool_call>`` tags (mlx-lm ``json_tools``)."""

    name = "hermes"
    start = "<tool_call>"
    end = "</tool_call>"
    xgrammar_model = "qwen_3"

    def open_block(self) -> JsonCallsBlock:
        return JsonCallsBlock(self.tools)

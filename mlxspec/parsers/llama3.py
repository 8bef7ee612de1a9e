"""Llama 3.x JSON tool calls: the reply is ``{"name": ..., "parameters": {...}}``.

Llama 3.1-3.3 templates ask for a bare JSON object (optionally after
``<|python_tag|>``), several separated by ``;``; there is no closing tag, so
the call runs to the end of the output and only counts when it opens it.
"""

from __future__ import annotations

from mlxspec.parsers.base import ToolParser
from mlxspec.parsers.json_calls import JsonCallsBlock


class Llama3JsonToolParser(ToolParser):
    """Bare JSON envelopes at the start of the reply."""

    name = "llama3_json"
    start = "{"
    end = ""
    only_at_start = True
    keep_start = True
    prefixes = ("<|python_tag|>",)
    xgrammar_model = "llama"

    def open_block(self) -> JsonCallsBlock:
        return JsonCallsBlock(self.tools)

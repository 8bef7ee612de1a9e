"""Pythonic tool calls: ``[get_weather(city="Paris"), get_time()]``.

Llama 3.2/4 and LFM2 write a Python list of calls, LFM2 between
``<|tool_call_start|>`` and ``<|tool_call_end|>``, Llama as the whole reply.
Parsing is mlx-lm's (``tool_parsers/pythonic.py``: ``ast`` with a regex fallback).
"""

from __future__ import annotations

from mlx_lm.tool_parsers import pythonic

from mlxspec.parsers.base import ToolParser
from mlxspec.parsers.whole import WholeBlock


class PythonicToolParser(ToolParser):
    """A list of calls between LFM2's sentinels."""

    name = "pythonic"
    start = pythonic.tool_call_start
    end = pythonic.tool_call_end

    def open_block(self) -> WholeBlock:
        return WholeBlock(self.tools, pythonic.parse_tool_call)


class BarePythonicToolParser(PythonicToolParser):
    """A reply that is a Python list of calls (Llama 3.2/4 pythonic templates)."""

    name = "pythonic_bare"
    start = "["
    end = ""
    only_at_start = True
    keep_start = True
    prefixes = ("<|python_start|>",)

"""Qwen3-Coder / Qwen3.5 XML tool calls.

``<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``.
Values are raw text: one framing newline at either end is removed and
nothing else (reference, chat "Tool calls"); string-typed parameters stream as
written, others are decoded against the tool's schema when complete.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mlxspec.parsers.args import ArgumentsWriter, decode_value, is_string_param, tool_properties
from mlxspec.parsers.base import (
    CallArguments,
    CallBegin,
    CallEnd,
    ParserDelta,
    ToolParser,
    held_prefix,
)

FUNCTION, PARAMETER = "<function=", "<parameter="
END_PARAMETER, END_FUNCTION = "</parameter>", "</function>"


class QwenXmlBlock:
    """Reads one ``<tool_call>`` block of Qwen XML incrementally."""

    def __init__(self, tools: Sequence[Mapping[str, Any]]) -> None:
        self.tools = tools
        self.buf = ""
        self.pos = 0
        self.state = "function"
        self.writer: ArgumentsWriter | None = None
        self.props: dict[str, Any] = {}
        self.key = ""
        self.value_start = 0
        self.sent = 0  # buf index up to which a streamed value was sent
        self.opened = False
        self.calls = 0

    def feed(self, text: str) -> list[ParserDelta]:
        """Read more of the block; return the deltas now certain."""
        self.buf += text
        out: list[ParserDelta] = []
        while getattr(self, "_" + self.state)(out):
            pass
        return out

    def _tag(self, opener: str) -> tuple[str, int] | None:
        """The ``NAME`` of ``<opener NAME>`` at ``pos`` and the index past ``>``."""
        at = self.buf.find(opener, self.pos)
        close = self.buf.find(">", at + len(opener)) if at >= 0 else -1
        if close < 0:
            return None
        return self.buf[at + len(opener) : close].strip(), close + 1

    def _function(self, out: list[ParserDelta]) -> bool:
        tag = self._tag(FUNCTION)
        if tag is None or not tag[0]:
            return False
        name, self.pos = tag
        self.writer, self.props = ArgumentsWriter(), tool_properties(self.tools, name)
        self.calls += 1
        out.append(CallBegin(name))
        self.state = "parameter"
        return True

    def _parameter(self, out: list[ParserDelta]) -> bool:
        assert self.writer is not None
        nxt = self.buf.find(PARAMETER, self.pos)
        end = self.buf.find(END_FUNCTION, self.pos)
        if end >= 0 and (nxt < 0 or end < nxt):
            self.pos = end + len(END_FUNCTION)
            self._end_call(out)
            return True
        tag = self._tag(PARAMETER) if nxt >= 0 else None
        if tag is None:
            return False
        self.key, self.pos = tag
        self.value_start = self.sent = self.pos
        self.state, self.opened = "value", False
        return True

    def _value_end(self) -> tuple[int, int] | None:
        """Where the value ends and where reading resumes (a missing
        ``</parameter>`` is tolerated before the next tag)."""
        found = []
        for tag, skip in ((END_PARAMETER, True), (PARAMETER, False), (END_FUNCTION, False)):
            at = self.buf.find(tag, self.value_start)
            if at >= 0:
                found.append((at, at + len(tag) if skip else at))
        return min(found) if found else None

    def _value(self, out: list[ParserDelta]) -> bool:
        assert self.writer is not None
        schema = self.props.get(self.key)
        streams = is_string_param(schema)
        if streams and not self.opened:
            if self.pos >= len(self.buf):
                return False
            if self.buf[self.value_start] == "\n":
                self.sent += 1
            self.opened = True
            self._send(out, self.writer.open_string(self.key))
        end = self._value_end()
        if end is None:
            if streams:  # hold back what may be a closing tag or the framing newline
                keep = max(
                    held_prefix(self.buf, t) for t in (END_PARAMETER, PARAMETER, END_FUNCTION)
                )
                stop = len(self.buf) - keep
                stop -= 1 if stop > self.sent and self.buf[stop - 1] == "\n" else 0
                if stop > self.sent:
                    self._send(out, self.writer.string_chunk(self.buf[self.sent : stop]))
                    self.sent = stop
            return False
        value = _unframe(self.buf[self.value_start : end[0]])
        if streams:
            tail = self.buf[self.sent : end[0]]
            tail = tail[:-1] if tail.endswith("\n") else tail
            self._send(out, self.writer.string_chunk(tail) + self.writer.close_string())
        else:
            self._send(out, self.writer.member(self.key, decode_value(value, schema, raw=True)))
        self.pos, self.state = end[1], "parameter"
        return True

    def _send(self, out: list[ParserDelta], fragment: str) -> None:
        if fragment:
            out.append(CallArguments(fragment))

    def _end_call(self, out: list[ParserDelta]) -> None:
        assert self.writer is not None
        self._send(out, self.writer.close())
        out.append(CallEnd())
        self.writer, self.state = None, "function"

    def close(self) -> list[ParserDelta] | None:
        """Finish the block; a cut-off value or function is closed as it stands."""
        out: list[ParserDelta] = []
        if self.state == "value":
            self.buf += END_PARAMETER
            self._value(out)
        if self.writer is not None:
            self._end_call(out)
        return out if self.calls else None


def _unframe(value: str) -> str:
    """Remove one framing newline at each end."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


class QwenXmlToolParser(ToolParser):
    """Qwen XML calls inside ``<tool_call>`` tags (mlx-lm ``qwen3_coder``)."""

    name = "qwen3_coder"
    start = "<tool_call>"
    end = "</tool_call>"
    xgrammar_model = "qwen_3_coder"

    def open_block(self) -> QwenXmlBlock:
        return QwenXmlBlock(self.tools)

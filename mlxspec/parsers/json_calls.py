"""Incremental parsing of JSON tool-call envelopes (``{"name": ..., "arguments": {...}}``).

Used by the Hermes/Qwen, Llama 3 and Mistral formats. The envelope is read as
the model writes it: the call starts once ``name`` is complete, then each
argument member is sent when its value is complete, and string members whose
schema type is ``string`` stream character by character. When the text stops
being strict JSON the incremental reader steps aside and :meth:`close` parses
the rest with the repair pass, keeping what was already sent.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from mlxspec.parsers.args import (
    ArgumentsWriter,
    decode_arguments,
    decode_value,
    is_string_param,
    repair_json,
    tool_properties,
)
from mlxspec.parsers.base import CallArguments, CallBegin, CallEnd, ParserDelta

_WS = " \t\r\n"
NAME_KEYS = ("name",)
ARGS_KEYS = ("arguments", "parameters")


def string_end(buf: str, start: int) -> int | None:
    """Index just past the JSON string opening at ``buf[start]``, or ``None`` if unterminated."""
    i, n = start + 1, len(buf)
    while i < n:
        c = buf[i]
        if c == "\\":
            i += 2
        elif c == '"':
            return i + 1
        else:
            i += 1
    return None


class ValueScanner:
    """Finds where the JSON value at ``start`` ends, resuming each look where
    the previous one stopped (so a long value costs linear time in total).

    Args:
        start (int): index of the value's first character.
    """

    def __init__(self, start: int) -> None:
        self.start = self.i = start
        self.depth = 0
        self.in_string = self.escaped = False

    def end(self, buf: str) -> int | None:
        """Index just past the value, or ``None`` while it may still grow
        (a scalar needs a delimiter after it)."""
        i, n = self.i, len(buf)
        while i < n:
            c = buf[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
                    if self.depth == 0:
                        return i + 1
            elif c == '"':
                self.in_string = True
            elif c in "{[":
                self.depth += 1
            elif c in "}]":
                if self.depth == 0:
                    return i
                self.depth -= 1
                if self.depth == 0:
                    return i + 1
            elif self.depth == 0 and (c in _WS or c == ","):
                return i
            i += 1
        self.i = i
        return None


_HEX4 = re.compile("[0-9a-fA-F]{4}")


def decode_string_body(raw: str) -> str:
    """Decode the inside of a JSON string, tolerating what models get wrong:
    raw control characters, and invalid escapes (``C:\\dir``), whose
    backslash is kept as text."""
    try:
        return json.loads('"' + raw + '"', strict=False)
    except json.JSONDecodeError:
        pass
    out, i, n = [], 0, len(raw)
    while i < n:
        if raw[i] == "\\":
            nxt = raw[i + 1 : i + 2]
            if nxt and nxt in '"\\/bfnrt':
                out.append(raw[i : i + 2])
                i += 2
                continue
            if nxt == "u" and _HEX4.fullmatch(raw[i + 2 : i + 6]):
                out.append(raw[i : i + 6])
                i += 6
                continue
            out.append("\\\\")
            i += 1
            continue
        out.append(raw[i])
        i += 1
    return json.loads('"' + "".join(out) + '"', strict=False)


def safe_string_prefix(buf: str, start: int) -> tuple[str, int, bool]:
    """Decode the complete part of a JSON string body beginning at ``start``.

    Returns:
        tuple[str, int, bool]: the decoded text, the index where decoding
        stopped, and whether the closing quote was reached (the index is then
        just past it). An escape cut by the buffer's end is left for later.
    """
    i, n = start, len(buf)
    while i < n:
        c = buf[i]
        if c == '"':
            return decode_string_body(buf[start:i]), i + 1, True
        if c == "\\":
            width = 6 if i + 1 < n and buf[i + 1] == "u" else 2
            if i + width > n:
                break
            hexa = buf[i + 2 : i + 6]
            if width == 6 and _HEX4.fullmatch(hexa) and 0xD800 <= int(hexa, 16) <= 0xDBFF:
                if i + 8 > n:  # a high surrogate waits to see whether its pair follows
                    break
                if buf[i + 6 : i + 8] == "\\u":
                    if i + 12 > n:
                        break
                    width = 12
            i += width
        else:
            i += 1
    return decode_string_body(buf[start:i]), i, False


class JsonCallsBlock:
    """Parses one marked block holding one JSON call, or a list/sequence of them.

    Args:
        tools (Sequence[Mapping]): the request's tools (argument schemas).
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]]) -> None:
        self.tools = tools
        self.buf = ""
        self.pos = 0
        self.state = "between"
        self.broken = False
        self.calls = 0
        self.env_start = 0
        self.key: str | None = None
        self.name: str | None = None
        self.writer: ArgumentsWriter | None = None
        self.props: dict[str, Any] = {}
        self.arg_key: str | None = None
        self.scanner = ValueScanner(0)

    # Incremental reading ------------------------------------------------
    def feed(self, text: str) -> list[ParserDelta]:
        """Read more of the block; return the deltas now certain."""
        self.buf += text
        out: list[ParserDelta] = []
        while not self.broken and self._step(out):
            pass
        return out

    def _skip(self, chars: str) -> str | None:
        while self.pos < len(self.buf) and self.buf[self.pos] in chars:
            self.pos += 1
        return self.buf[self.pos] if self.pos < len(self.buf) else None

    def _value_end(self) -> int | None:
        if self.scanner.start != self.pos:
            self.scanner = ValueScanner(self.pos)
        return self.scanner.end(self.buf)

    def _step(self, out: list[ParserDelta]) -> bool:
        handler = getattr(self, "_" + self.state)
        return handler(out)

    def _between(self, out: list[ParserDelta]) -> bool:
        c = self._skip(_WS + ",;[]")
        if c is None:
            return False
        if c != "{":
            self.broken = True
            return False
        self.env_start, self.pos, self.state = self.pos, self.pos + 1, "env_key"
        self.name, self.writer = None, None
        return True

    def _key(self) -> str | None | bool:
        """A complete object key and its colon, ``None`` to wait, False if broken."""
        if self._skip(_WS + ",") != '"':
            return None if self.pos >= len(self.buf) else False
        end = string_end(self.buf, self.pos)
        if end is None:
            return None
        colon = end
        while colon < len(self.buf) and self.buf[colon] in _WS:
            colon += 1
        if colon >= len(self.buf):
            return None
        if self.buf[colon] != ":":
            return False
        key = decode_string_body(self.buf[self.pos + 1 : end - 1])
        self.pos = colon + 1
        return key

    def _read_key(self) -> str | None:
        """:meth:`_key`, marking the call broken on a malformed key; ``None``
        when there is no key yet (wait) or it is broken."""
        key = self._key()
        if key is False:
            self.broken = True
        return key if isinstance(key, str) else None

    def _close_arguments(self, out: list[ParserDelta]) -> None:
        """Close the arguments object, emitting whatever the writer still holds."""
        assert self.writer is not None
        fragment = self.writer.close()
        if fragment:
            out.append(CallArguments(fragment))

    def _env_key(self, out: list[ParserDelta]) -> bool:
        if self._skip(_WS + ",") == "}":
            self.pos += 1
            self._end_call(out)
            return True
        key = self._read_key()
        if key is None:
            return False
        self.key, self.state = key, "env_value"
        return True

    def _env_value(self, out: list[ParserDelta]) -> bool:
        c = self._skip(_WS)
        if c is None:
            return False
        if self.key in ARGS_KEYS and c == "{" and self.writer is not None:
            self.pos += 1
            self.state = "arg_key"
            return True
        end = self._value_end()
        if end is None:
            return False
        raw = self.buf[self.pos : end]
        self.pos = end
        self.state = "env_key"
        if self.key in NAME_KEYS and self.writer is None:
            try:
                name = json.loads(raw, strict=False)
            except json.JSONDecodeError:
                name = None
            if not isinstance(name, str) or not name:
                self.broken = True
                return False
            self._begin(name, out)
        elif self.key in ARGS_KEYS:
            self.broken = True  # arguments before the name, or as a string: parse at close
        return True

    def _begin(self, name: str, out: list[ParserDelta]) -> None:
        self.name, self.writer = name, ArgumentsWriter()
        self.props = tool_properties(self.tools, name)
        self.calls += 1
        out.append(CallBegin(name))

    def _end_call(self, out: list[ParserDelta]) -> None:
        if self.writer is None:  # an envelope with no name is not a call
            self.broken = True
            return
        self._close_arguments(out)
        out.append(CallEnd())
        self.writer, self.state = None, "between"

    def _arg_key(self, out: list[ParserDelta]) -> bool:
        assert self.writer is not None
        if self._skip(_WS + ",") == "}":
            self.pos += 1
            self.state = "env_key"
            self._close_arguments(out)
            return True
        key = self._read_key()
        if key is None:
            return False
        self.arg_key, self.state = key, "arg_value"
        return True

    def _arg_value(self, out: list[ParserDelta]) -> bool:
        assert self.writer is not None and self.arg_key is not None
        c = self._skip(_WS)
        if c is None:
            return False
        schema = self.props.get(self.arg_key)
        if c == '"' and (is_string_param(schema) or schema is None):
            fragment = self.writer.open_string(self.arg_key)
            out += [CallArguments(fragment)] if fragment else []
            self.pos += 1
            self.state = "arg_string"
            return True
        end = self._value_end()
        if end is None:
            return False
        try:
            value = json.loads(self.buf[self.pos : end], strict=False)
        except json.JSONDecodeError:
            self.broken = True
            return False
        self.pos, self.state = end, "arg_key"
        fragment = self.writer.member(self.arg_key, decode_value(value, schema))
        out += [CallArguments(fragment)] if fragment else []
        return True

    def _arg_string(self, out: list[ParserDelta]) -> bool:
        assert self.writer is not None
        text, self.pos, done = safe_string_prefix(self.buf, self.pos)
        fragment = self.writer.string_chunk(text) if text else ""
        if done:
            fragment += self.writer.close_string()
            self.state = "arg_key"
        out += [CallArguments(fragment)] if fragment else []
        return done

    # Closing ------------------------------------------------------------
    def close(self) -> list[ParserDelta] | None:
        """Finish the block: repair-parse what the reader could not, keep what
        was sent. ``None`` when the block held no call at all."""
        out: list[ParserDelta] = []
        if self.state == "between" and not self.broken:
            return out if self.calls else None
        rest = self.buf[self.env_start :] if self.state != "between" else self.buf[self.pos :]
        for envelope in _envelopes(rest):
            self._finish_envelope(envelope, out)
        if self.writer is not None:  # still open and nothing parsed: close what was sent
            self._end_call(out)
        return out if self.calls else None

    def _finish_envelope(self, envelope: Mapping[str, Any], out: list[ParserDelta]) -> None:
        name, arguments = _name_and_arguments(envelope, self.tools)
        if self.writer is None:
            if name is None:
                return
            self._begin(name, out)
        assert self.writer is not None
        decoded = decode_arguments(arguments, self.props)
        fragment = self.writer.close(decoded)
        out += [CallArguments(fragment)] if fragment else []
        out.append(CallEnd())
        self.writer = None


def _envelopes(text: str) -> list[Mapping[str, Any]]:
    """The call objects in ``text``: strict JSON first, then the repair pass."""
    try:
        value: Any = json.loads(text, strict=False)
    except json.JSONDecodeError:
        value = repair_json(text)
    if isinstance(value, Mapping):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, Mapping)]
    return []


def _name_and_arguments(
    envelope: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]
) -> tuple[str | None, dict[str, Any]]:
    """Name and argument object of one envelope; a name that landed inside
    the arguments is lifted out (reference, chat "Tool calls")."""
    function = envelope.get("function")
    if isinstance(function, Mapping) and "name" in function:
        envelope = function
    arguments: Any = next((envelope[k] for k in ARGS_KEYS if k in envelope), {})
    if isinstance(arguments, str):
        parsed = repair_json(arguments) if arguments.strip() else {}
        arguments = parsed if isinstance(parsed, dict) else {}
    if not isinstance(arguments, dict):
        arguments = {}
    name = envelope.get("name")
    if not isinstance(name, str) and isinstance(arguments.get("name"), str):
        arguments = dict(arguments)
        name = arguments.pop("name")
    return (name if isinstance(name, str) and name else None), arguments

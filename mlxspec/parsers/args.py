"""Tool-call arguments: canonical JSON written incrementally, schema decoding, repair.

:class:`ArgumentsWriter` writes an arguments object member by member, in
``json.dumps`` form (``{"k": v, "k2": v2}``), so the fragments it returns
concatenate to exactly ``json.dumps(arguments, ensure_ascii=False)``. A string
member can stream character by character: JSON escaping is per character, so
escaping a prefix gives a prefix of the escaped whole.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def dumps(value: Any) -> str:
    """JSON text as the writer emits it (``json.dumps`` defaults, UTF-8 kept).

    A lone surrogate (from a model's ``\\ud83d`` escape without its pair)
    stays an escape, so the text can always be encoded as UTF-8; values JSON
    cannot hold (a set from a Python literal) are written as their ``str``.
    """
    text = json.dumps(value, ensure_ascii=False, default=str)
    return _LONE_SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def escape(text: str) -> str:
    """``text`` escaped for the inside of a JSON string (no quotes)."""
    return dumps(text)[1:-1]


class ArgumentsWriter:
    """Builds one call's arguments JSON as a stream of fragments.

    Call :meth:`member` for a complete value, or :meth:`open_string`,
    :meth:`string_chunk` and :meth:`close_string` to stream a string value;
    :meth:`close` ends the object. Each returns the fragment to send (maybe "").
    """

    def __init__(self) -> None:
        self.keys: list[str] = []
        self.open_key: str | None = None
        self.streamed = ""
        self.closed = False

    def _head(self, key: str) -> str:
        sep = "{" if not self.keys else ", "
        self.keys.append(key)
        return f"{sep}{dumps(key)}: "

    def member(self, key: str, value: Any) -> str:
        """A whole ``key: value`` member (a repeated key is dropped, first wins)."""
        if key in self.keys or self.closed:
            return ""
        return self._head(key) + dumps(value)

    def open_string(self, key: str) -> str:
        """Start a string member whose value will stream."""
        if key in self.keys or self.closed:
            return ""
        self.open_key, self.streamed = key, ""
        return self._head(key) + '"'

    def string_chunk(self, text: str) -> str:
        """More characters of the open string member."""
        if self.open_key is None:
            return ""
        self.streamed += text
        return escape(text)

    def close_string(self, final: str | None = None) -> str:
        """End the open string member. ``final`` (the value as finally
        parsed) adds its unsent tail when it extends what was streamed."""
        if self.open_key is None:
            return ""
        tail = ""
        if final is not None and final.startswith(self.streamed):
            tail = escape(final[len(self.streamed) :])
        self.open_key = None
        return tail + '"'

    def close(self, remaining: Mapping[str, Any] | None = None) -> str:
        """End the object, first adding members of ``remaining`` not yet written."""
        if self.closed:
            return ""
        final = (remaining or {}).get(self.open_key or "")
        out = self.close_string(final if isinstance(final, str) else None)
        for key, value in (remaining or {}).items():
            out += self.member(key, value)
        self.closed = True
        return out + ("}" if self.keys else "{}")


# Schema decoding (reference, chat "Tool calls": string-typed params stay strings).


def tool_properties(tools: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any]:
    """The ``parameters.properties`` schema of tool ``name`` (``{}`` if unknown)."""
    for tool in tools:
        function = tool.get("function") or {}
        if function.get("name") == name:
            params = function.get("parameters") or {}
            props = params.get("properties") if isinstance(params, Mapping) else None
            return dict(props) if isinstance(props, Mapping) else {}
    return {}


def schema_types(schema: Any) -> set[str]:
    """The JSON types a property schema allows (``type`` string or list, ``enum`` of strings)."""
    if not isinstance(schema, Mapping):
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
        return {"string"}
    types: set[str] = set()
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or ():
            types |= schema_types(sub)
    return types


def is_string_param(schema: Any) -> bool:
    """A property that is only ever a string: its value can stream verbatim."""
    return schema_types(schema) == {"string"}


def decode_value(value: Any, schema: Any, raw: bool = False) -> Any:
    """Coerce one argument value to the type its schema declares.

    Strings stay strings for string-typed properties; a string holding JSON
    (or a Python literal) is decoded for object, array, number, integer and
    boolean properties; anything that does not decode is left as it was.

    Args:
        value: the parsed value (raw text for XML formats).
        schema: the property's JSON schema, or ``None``.
        raw (bool): ``value`` is raw markup text (XML formats), so structured
            text is decoded even without a schema. Default: ``False``.

    Returns:
        The decoded value.
    """
    types = schema_types(schema)
    if not isinstance(value, str) or "string" in types:
        return value
    if not types:  # no schema: only raw structured text is decoded
        if not raw:
            return value
        parsed = _loads(value)
        return parsed if isinstance(parsed, (dict, list)) else value
    parsed = _loads(value.strip())
    if parsed is _FAIL:
        if "boolean" in types and value.strip().lower() in ("true", "false"):
            return value.strip().lower() == "true"
        return None if value.strip().lower() in ("null", "none") and "null" in types else value
    kinds = {
        "object": dict,
        "array": list,
        "integer": int,
        "number": (int, float),
        "boolean": bool,
        "null": type(None),
    }
    for kind in types:
        expected = kinds.get(kind)
        if expected is not None and isinstance(parsed, expected):
            if kind in ("integer", "number") and isinstance(parsed, bool):
                continue
            return parsed
    if "integer" in types and isinstance(parsed, float) and parsed.is_integer():
        return int(parsed)
    return value


def decode_arguments(
    arguments: Mapping[str, Any], properties: Mapping[str, Any], raw: bool = False
) -> dict:
    """:func:`decode_value` for each member, against ``properties``."""
    return {k: decode_value(v, properties.get(k), raw) for k, v in arguments.items()}


_FAIL = object()


def _loads(text: str) -> Any:
    try:
        return json.loads(text, strict=False)
    except (json.JSONDecodeError, ValueError):
        pass
    repaired = repair_json(text)
    if repaired is not None:
        return repaired
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _FAIL


# Repair (reference, chat "Tool calls": the pass that runs before giving up).

_FENCE = re.compile(r"^\s*```[a-zA-Z]*\s*\n?(.*?)\n?\s*```\s*$", re.DOTALL)
_PY_LITERALS = {"True": "true", "False": "false", "None": "null"}
_HEX4 = re.compile("[0-9a-fA-F]{4}")


def repair_json(text: str) -> Any:
    """Parse almost-JSON a model wrote, or return ``None``.

    Tries, in order: a fenced block or prose before the first bracket is
    stripped; single-quoted strings become double-quoted; Python literals
    ``True``/``False``/``None`` outside strings become JSON's; trailing commas
    go; unclosed strings, arrays and objects are closed.

    Args:
        text (str): the text.

    Returns:
        The parsed value, or ``None`` when even the repaired text is not JSON.
    """
    fence = _FENCE.match(text)
    body = fence.group(1) if fence else text
    starts = [i for i in (body.find("{"), body.find("[")) if i >= 0]
    if not starts:
        return None
    body = body[min(starts) :]
    fixed = _close(_normalize(body))
    for candidate in (fixed, fixed.rstrip()):
        try:
            value, _ = json.JSONDecoder(strict=False).raw_decode(candidate)
            return value
        except json.JSONDecodeError:
            continue
    return None


def _normalize(text: str) -> str:
    """Requote single-quoted strings, map Python literals outside strings,
    drop trailing commas; one pass that tracks string state."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c in "\"'":
            j, piece = i + 1, []
            while j < n and text[j] != c:
                if text[j] == "\\" and j + 1 < n:
                    esc = text[j + 1]
                    hexa = _HEX4.fullmatch(text[j + 2 : j + 6])
                    valid = esc in '"\\/bfnrt' or (esc == "u" and hexa is not None)
                    piece.append("'" if esc == "'" else text[j : j + 2] if valid else "\\\\")
                    j += 2 if valid or esc == "'" else 1
                    continue
                piece.append('\\"' if text[j] == '"' else text[j])
                j += 1
            out.append('"' + "".join(piece) + ('"' if j < n else ""))
            i = j + 1
            continue
        word = re.match(r"True|False|None", text[i:])
        if word and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            out.append(_PY_LITERALS[word.group()])
            i += len(word.group())
            continue
        if c == ",":
            rest = text[i + 1 :].lstrip()
            if rest[:1] in ("}", "]"):
                i += 1
                continue
        out.append(c)
        i += 1
    return "".join(out)


def _close(text: str) -> str:
    """Close an unterminated string and any open arrays and objects."""
    stack: list[str] = []
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
            continue
        if c == '"':
            in_string = True
        elif c in "{[":
            stack.append("}" if c == "{" else "]")
        elif c in "}]" and stack:
            stack.pop()
    tail = '"' if in_string else ""
    stripped = (text + tail).rstrip()
    if stripped.endswith(","):
        stripped = stripped[:-1]
    if stripped.endswith(":"):
        stripped += " null"
    return stripped + "".join(reversed(stack))

"""Event-stream checks: mlxspec's SSE framing and the OpenAI-style streams.

The document's ``text/event-stream`` schemas describe one event (OpenAPI 3.1
has no ``itemSchema``), so a stream is checked frame by frame. The chat and
completions streams are ``data: <payload>\\n\\n`` frames (or ``:`` comment
keep-alives) ending with ``data: [DONE]`` or an error frame; each payload must
match the event schema and its ``contentSchema``. Where the event schema
requires ``event`` (the Responses stream), every frame is ``event: <name>``
plus ``data: <payload>`` and the payload's ``type`` repeats the name. The
Anthropic stream's grammar lives in :mod:`mlxspec.conformance.anthropic_contract`,
which splits its frames with :func:`split_named_event_stream` from here.
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema_path import SchemaPath

from mlxspec.conformance.schema_checks import ERROR_ROWS, fail, schema_errors, validate

__all__ = [
    "check_event_stream",
    "frame_kind",
    "split_event_stream",
    "split_named_event_stream",
]


def split_event_stream(body: bytes, where: str = "stream") -> list[str]:
    """Split an event stream into its ``data`` payloads, enforcing mlxspec's framing.

    Stricter than the WHATWG parser (HTML Living Standard, "Server-sent
    events", section 9.2.6): every event is exactly one ``data: <payload>``
    line followed by a blank line, with ``\\n`` line ends; blocks of ``:``
    comment lines (keep-alives) are skipped.

    Args:
        body (bytes): the whole stream, UTF-8.
        where (str): context for error messages. Default: ``"stream"``.

    Returns:
        list[str]: the payloads in order (``"[DONE]"`` included).

    Raises:
        ContractViolation: bad UTF-8, ``\\r``, a frame with other fields or
            several lines, or a stream that does not end with a blank line.
    """
    payloads = []
    for block in _event_blocks(body, where):
        if len(block) != 1 or not block[0].startswith("data: "):
            raise fail(where, f"frame is not one 'data: ' line: {chr(10).join(block)[:120]!r}")
        payloads.append(block[0][len("data: ") :])
    return payloads


def split_named_event_stream(body: bytes, where: str = "stream") -> list[tuple[str, str]]:
    """Split a named-event stream (Responses, Anthropic) into ``(event, data)`` pairs.

    Same framing as :func:`split_event_stream`, except that every event is
    exactly an ``event: <name>`` line then one ``data: <payload>`` line.

    Raises:
        ContractViolation: as :func:`split_event_stream`, or a frame that is
            not exactly those two lines.
    """
    events = []
    for block in _event_blocks(body, where):
        if (
            len(block) != 2
            or not block[0].startswith("event: ")
            or not block[1].startswith("data: ")
        ):
            raise fail(
                where, f"frame is not 'event: ' then 'data: ': {chr(10).join(block)[:120]!r}"
            )
        events.append((block[0][len("event: ") :], block[1][len("data: ") :]))
    return events


def _event_blocks(body: bytes, where: str) -> list[list[str]]:
    """The stream's frames as lists of lines, keep-alive comment blocks dropped."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise fail(where, "event stream is not UTF-8") from exc
    if "\r" in text:
        raise fail(where, "event stream frames end with \\n only")
    if not text.endswith("\n\n"):
        raise fail(where, f"event stream does not end with a blank line: {text[-80:]!r}")
    blocks = [block.split("\n") for block in text[:-2].split("\n\n")]
    return [lines for lines in blocks if not all(line.startswith(":") for line in lines)]


def check_event_stream(event_schema: SchemaPath, body: bytes, where: str = "stream") -> None:
    """Check a whole event stream against a per-event schema of the document.

    Each payload is validated as ``{"data": payload}`` against ``event_schema``
    and, for JSON payloads, against the ``contentSchema`` of the first
    ``data.anyOf`` branch it satisfies. Order, from the generation routes'
    descriptions: ``[DONE]`` or an error frame ends the stream and nothing
    follows either; only the last chunk has a non-null ``finish_reason``, and
    before ``[DONE]`` it also carries ``usage`` (or, with ``include_usage``, one
    more chunk with ``choices: []`` carries it, and no other); all chunks share one ``id``;
    an error frame's ``type``/``code`` is a row of the error table. A schema
    that requires ``event`` (Responses) is checked as a named-event stream.

    Args:
        event_schema (SchemaPath): e.g. the ``text/event-stream`` media type's schema.
        body (bytes): the whole stream.
        where (str): context for error messages. Default: ``"stream"``.

    Raises:
        ContractViolation: the first frame or ordering rule broken.
    """
    with event_schema.resolve() as resolved:
        named = "event" in resolved.contents.get("required", [])
    if named:
        _check_named_stream(event_schema, body, where)
        return
    payloads = split_event_stream(body, where)
    if not payloads:
        raise fail(where, "event stream has no data frames")
    kinds = []
    for i, payload in enumerate(payloads):
        validate(event_schema, {"data": payload}, f"{where} frame {i}")
        kinds.append(frame_kind(event_schema, payload, f"{where} frame {i}"))
    for i, kind in enumerate(kinds[:-1]):
        if kind != "chunk":
            raise fail(where, f"frame {i} ({kind}) must be the last, {len(kinds) - i - 1} follow")
    chunks = [json.loads(p) for p, k in zip(payloads, kinds, strict=True) if k == "chunk"]
    _check_chunk_order(chunks, kinds[-1], where)
    if kinds[-1] == "error":
        error = json.loads(payloads[-1])["error"]
        if (error.get("type"), error.get("code")) not in {row[1:] for row in ERROR_ROWS}:
            raise fail(where, f"in-band error {error} is not a row of mlxspec.errors.ERROR_TABLE")


def _check_named_stream(event_schema: SchemaPath, body: bytes, where: str) -> None:
    """A named-event stream (the event schema requires ``event``): every frame
    matches the schema, its JSON ``type`` repeats the ``event`` name, and
    ``sequence_number`` (where the events carry one) counts from 0 by 1."""
    events = split_named_event_stream(body, where)
    if not events:
        raise fail(where, "event stream has no data frames")
    for i, (name, payload) in enumerate(events):
        validate(event_schema, {"event": name, "data": payload}, f"{where} frame {i}")
        frame_kind(event_schema, payload, f"{where} frame {i}")
        data = json.loads(payload)
        if data.get("type") != name:
            raise fail(where, f"frame {i}: event {name!r} carries type {data.get('type')!r}")
        if "sequence_number" in data and data["sequence_number"] != i:
            raise fail(where, f"frame {i}: sequence_number {data['sequence_number']}, expected {i}")


def frame_kind(event_schema: SchemaPath, payload: str, where: str) -> str:
    """Which ``data.anyOf`` branch of an event schema one payload satisfies.

    A branch with ``const`` matches that exact payload (``[DONE]``); a branch
    with ``contentSchema`` matches JSON valid against it, so this also checks
    the payload's ``contentSchema``.

    Args:
        event_schema (SchemaPath): the ``text/event-stream`` media type's schema.
        payload (str): one frame's ``data``.
        where (str): context for error messages.

    Returns:
        str: ``"done"``, ``"error"`` (an ``ErrorResponse`` payload) or ``"chunk"``.

    Raises:
        ContractViolation: the payload matches no branch.
    """
    failures = []
    for node in event_schema / "properties" / "data" / "anyOf":
        with node.resolve() as resolved:
            contents = resolved.contents
        if "const" in contents:
            if payload == contents["const"]:
                return "done"
            continue
        if "contentSchema" not in contents:
            continue
        try:
            problem = schema_errors(node / "contentSchema", json.loads(payload))
        except ValueError:
            problem = "not JSON"
        if problem:
            failures.append(problem)
            continue
        ref = contents["contentSchema"].get("$ref", "")
        return "error" if ref.endswith("/ErrorResponse") else "chunk"
    raise fail(where, f"{payload[:120]!r} matches no frame kind: {' | '.join(failures)}")


def _check_chunk_order(chunks: list[dict[str, Any]], last: str, where: str) -> None:
    if last == "chunk":
        raise fail(where, "stream ended without data: [DONE] or an error frame")
    if len({c.get("id") for c in chunks}) > 1:
        raise fail(where, "chunks of one stream must share one id")
    # Per choice index (n > 1 interleaves choices): finish_reason on that
    # choice's last chunk only; the stream's last chunk finishes the last choice.
    finished: dict[Any, list[int]] = {}
    last_seen: dict[Any, int] = {}
    for i, c in enumerate(chunks):
        for choice in c.get("choices", []):
            last_seen[choice.get("index")] = i
            if choice.get("finish_reason") is not None:
                finished.setdefault(choice.get("index"), []).append(i)
    if last == "done":
        for index, seen in last_seen.items():
            if finished.get(index) != [seen]:
                raise fail(
                    where,
                    f"finish_reason must be set on choice {index}'s last chunk only, "
                    f"got {finished.get(index)}",
                )
        # stream_options.include_usage: usage in a last chunk of its own, choices [].
        apart = bool(chunks) and chunks[-1].get("choices") == []
        finishing = len(chunks) - 2 if apart else len(chunks) - 1
        if not chunks or finishing not in {s[0] for s in finished.values()}:
            raise fail(where, "the last chunk with choices must carry a finish_reason")
        # usage: in that chunk of its own, or (--stream-usage always) on the
        # chunk that finishes the last choice, or in none (OpenAI's default).
        if apart and not isinstance(chunks[-1].get("usage"), dict):
            raise fail(where, "a last chunk without choices must carry usage")
        if any(c.get("usage") is not None for c in chunks[:-1]):
            raise fail(where, "only the last chunk before [DONE] may carry usage")
    elif finished:
        raise fail(where, "a stream that ends in an error has no finish_reason")

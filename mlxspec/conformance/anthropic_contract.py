"""Contract rules of the Anthropic surface (``/v1/messages``), used by
:mod:`mlxspec.conformance.contract` for paths of that surface.

Anthropic streams are named events (``event: <type>`` then one ``data:`` line
whose JSON has the same ``type``) in a fixed grammar (Anthropic's "Streaming
Messages"): ``message_start``; per content block ``content_block_start``, its
deltas, ``content_block_stop``, with indexes 0, 1, ...; ``message_delta``;
``message_stop``; ``ping`` anywhere after ``message_start``; an ``error`` frame
ends the stream early. Errors use Anthropic's envelope, whose ``error.type``
follows the status (:func:`mlxspec.errors.anthropic_error_type`).
"""

from __future__ import annotations

import json
from typing import Any

from jsonschema_path import SchemaPath

from mlxspec.conformance.schema_checks import fail, validate
from mlxspec.conformance.stream_contract import frame_kind, split_named_event_stream
from mlxspec.errors import anthropic_error_type

__all__ = ["check_error_type", "check_event_stream", "check_stream_order", "split_named_events"]

#: The delta types each content block type takes.
_DELTAS = {"text": {"text_delta"}, "thinking": {"thinking_delta"}, "tool_use": {"input_json_delta"}}


def split_named_events(body: bytes, where: str = "stream") -> list[tuple[str, str]]:
    """Split a Messages stream into ``(event name, data payload)`` pairs
    (:func:`~.stream_contract.split_named_event_stream`), requiring at least one.

    Raises:
        ContractViolation: bad framing, or no events at all.
    """
    events = split_named_event_stream(body, where)
    if not events:
        raise fail(where, "event stream has no events")
    return events


def check_event_stream(event_schema: SchemaPath, body: bytes, where: str = "stream") -> None:
    """Check a whole Messages stream against the document and the event grammar.

    Each ``event:``/``data:`` frame is validated against ``event_schema`` and
    the ``contentSchema`` its payload matches, then the sequence against
    :func:`check_stream_order`.

    Args:
        event_schema (SchemaPath): the route's ``text/event-stream`` media type's schema.
        body (bytes): the whole stream.
        where (str): context for error messages. Default: ``"stream"``.

    Raises:
        ContractViolation: the first frame or grammar rule broken.
    """
    events = []
    for i, (name, payload) in enumerate(split_named_events(body, where)):
        validate(event_schema, {"event": name, "data": payload}, f"{where} frame {i}")
        frame_kind(event_schema, payload, f"{where} frame {i}")  # checks the contentSchema
        events.append((name, json.loads(payload)))
    check_stream_order(events, where)


def check_stream_order(events: list[tuple[str, Any]], where: str = "stream") -> None:
    """Check the event grammar of one Messages stream.

    Args:
        events (list[tuple[str, Any]]): ``(event name, decoded data)`` pairs,
            each already valid against the document's event schema.
        where (str): context for error messages. Default: ``"stream"``.

    Raises:
        ContractViolation: the first rule broken.
    """
    names = [name for name, _ in events]
    for i, (name, data) in enumerate(events):
        if data.get("type") != name:
            raise fail(where, f"frame {i}: event {name!r} carries type {data.get('type')!r}")
    if names[0] != "message_start":
        raise fail(where, f"a stream starts with message_start, not {names[0]}")
    if "error" in names:
        last = names.index("error")
        if last != len(names) - 1:
            raise fail(where, "nothing may follow an error event")
    elif names[-2:] != ["message_delta", "message_stop"]:
        raise fail(where, f"a stream ends with message_delta, message_stop: {names[-2:]}")
    body = [(n, d) for n, d in events[1:] if n not in ("ping", "error")]
    if "message_delta" in names:
        body = body[:-2]
    _check_blocks(body, where, complete="error" not in names)


def _check_blocks(events: list[tuple[str, Any]], where: str, complete: bool) -> None:
    """content_block_start / delta* / stop runs with indexes 0, 1, ...; the last
    block may stay open only in a stream an error ended."""
    open_type: str | None = None
    expected = 0
    for name, data in events:
        if name == "content_block_start":
            if open_type is not None or data["index"] != expected:
                raise fail(where, f"block {data['index']} starts out of order")
            open_type = data["content_block"]["type"]
        elif name in ("content_block_delta", "content_block_stop"):
            if open_type is None or data["index"] != expected:
                raise fail(where, f"{name} for block {data['index']}, which is not open")
            if name == "content_block_stop":
                open_type, expected = None, expected + 1
            elif data["delta"]["type"] not in _DELTAS[open_type]:
                raise fail(where, f"{data['delta']['type']} inside a {open_type} block")
        else:
            raise fail(where, f"{name} inside the content blocks")
    if complete and open_type is not None:
        raise fail(where, f"block {expected} was never stopped")


def check_error_type(status: int, body: bytes, where: str) -> None:
    """An Anthropic error body's ``error.type`` must be the one for its status.

    Raises:
        ContractViolation: a type that does not follow the status.
    """
    kind = json.loads(body).get("error", {}).get("type")
    if kind != anthropic_error_type(status):
        raise fail(where, f"error type {kind!r} does not match status {status}")

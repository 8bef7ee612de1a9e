"""Contract rules of the Anthropic surface (``/v1/messages``), used by
:mod:`mlxspec.conformance.contract`.

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

from mlxspec.errors import anthropic_error_type

from .contract import ContractViolation

__all__ = ["check_error_type", "check_stream_order", "split_named_events"]

#: The delta types each content block type takes.
_DELTAS = {"text": {"text_delta"}, "thinking": {"thinking_delta"}, "tool_use": {"input_json_delta"}}


def _fail(where: str, message: str) -> ContractViolation:
    return ContractViolation(f"{where}: {message}")


def split_named_events(body: bytes, where: str = "stream") -> list[tuple[str, str]]:
    """Split a Messages stream into ``(event name, data payload)`` pairs
    (:func:`~.contract.split_named_event_stream`), requiring at least one.

    Raises:
        ContractViolation: bad framing, or no events at all.
    """
    from .contract import split_named_event_stream

    events = split_named_event_stream(body, where)
    if not events:
        raise _fail(where, "event stream has no events")
    return events


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
            raise _fail(where, f"frame {i}: event {name!r} carries type {data.get('type')!r}")
    if names[0] != "message_start":
        raise _fail(where, f"a stream starts with message_start, not {names[0]}")
    if "error" in names:
        last = names.index("error")
        if last != len(names) - 1:
            raise _fail(where, "nothing may follow an error event")
    elif names[-2:] != ["message_delta", "message_stop"]:
        raise _fail(where, f"a stream ends with message_delta, message_stop: {names[-2:]}")
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
                raise _fail(where, f"block {data['index']} starts out of order")
            open_type = data["content_block"]["type"]
        elif name in ("content_block_delta", "content_block_stop"):
            if open_type is None or data["index"] != expected:
                raise _fail(where, f"{name} for block {data['index']}, which is not open")
            if name == "content_block_stop":
                open_type, expected = None, expected + 1
            elif data["delta"]["type"] not in _DELTAS[open_type]:
                raise _fail(where, f"{data['delta']['type']} inside a {open_type} block")
        else:
            raise _fail(where, f"{name} inside the content blocks")
    if complete and open_type is not None:
        raise _fail(where, f"block {expected} was never stopped")


def check_error_type(status: int, body: bytes, where: str) -> None:
    """An Anthropic error body's ``error.type`` must be the one for its status.

    Raises:
        ContractViolation: a type that does not follow the status.
    """
    kind = json.loads(body).get("error", {}).get("type")
    if kind != anthropic_error_type(status):
        raise _fail(where, f"error type {kind!r} does not match status {status}")

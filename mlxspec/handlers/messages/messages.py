"""``POST /v1/messages`` (``createMessage``) and ``POST /v1/messages/count_tokens``
(``countMessageTokens``): Anthropic's Messages API on the chat path.

The request is translated by :func:`mlxspec.handlers.messages.anthropic.to_chat_body` and
run by :func:`~mlxspec.handlers.turns.turns.open_turn`; this module renders the turn
as an Anthropic ``Message`` or as Anthropic's stream grammar (message_start,
content_block_start/delta/stop, message_delta, message_stop), framed by
:func:`mlxspec.http.sse.anthropic_events`. Errors get Anthropic's envelope from the
app's error handlers (``errors.surface_for_path``).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

from mlxspec.engine import Finished
from mlxspec.handlers.adapters.select import with_model
from mlxspec.handlers.context import JSON, current_engine
from mlxspec.handlers.messages.anthropic import to_chat_body
from mlxspec.handlers.turns.parser import (
    ChatEvent,
    ChatTurn,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallCut,
    ToolCallStart,
    TurnEnd,
)
from mlxspec.handlers.turns.turns import Turn, collect_turn, count_prompt, open_turn, turn_events
from mlxspec.http import sse


async def create_message(body: dict[str, Any]) -> Any:
    """Translate, generate, and answer as an Anthropic ``Message`` or event stream
    (with a ``Warning`` header when a forced tool call's grammar is not enforced)."""
    engine = current_engine()
    turn = await open_turn(engine, with_model(to_chat_body(body), body))
    head = {
        "id": f"msg_{uuid.uuid4().hex}",
        "type": "message",
        "role": "assistant",
        "model": engine.info.id,
    }
    if body.get("stream"):
        # Keep-alive comments while a prefill runs or a tool call is withheld.
        payloads = sse.with_keepalive(_stream(turn, head))
        frames = sse.anthropic_events(payloads, on_close=turn.handle.cancel)
        response = sse.event_stream(frames)
        response.headers.update(turn.warning)
        return response
    result = await collect_turn(turn)
    return message_body(head, result), 200, {**JSON, **turn.warning}


#: The fields that shape a Messages prompt (the document's AnthropicPromptParameters).
PROMPT_FIELDS = frozenset(
    {
        "model",
        "system",
        "messages",
        "tools",
        "tool_choice",
        "thinking",
        "session_id",
        "prompt_cache_key",
        "output_config",
        "output_format",
    }
)


async def count_message_tokens(body: dict[str, Any]) -> Any:
    """``{"input_tokens": n}``: the length of the prompt ``createMessage`` would
    run for the same body (same translation and template), without generating."""
    engine = current_engine()
    # Only the prompt's fields (the ones AnthropicPromptParameters validates) are
    # read: generation fields are not validated on this route, so never used.
    chat = to_chat_body({k: v for k, v in body.items() if k in PROMPT_FIELDS})
    return {"input_tokens": await count_prompt(engine, chat)}, 200, JSON


def stop_fields(finish_reason: str, finished: Finished) -> dict[str, str | None]:
    """Anthropic's ``stop_reason`` and ``stop_sequence`` for a turn's end.

    Args:
        finish_reason (str): the turn's ``"stop"``, ``"length"`` or ``"tool_calls"``.
        finished (Finished): the engine's end event (its ``stop_sequence``).

    Returns:
        dict: ``stop_reason`` is ``tool_use``, ``max_tokens`` (the budget or the
        context window ran out), ``stop_sequence`` or ``end_turn`` (EOS);
        ``stop_sequence`` is the matched string only with ``stop_sequence``.
    """
    if finish_reason == "tool_calls":
        reason = "tool_use"
    elif finish_reason == "length":
        reason = "max_tokens"
    else:
        reason = "stop_sequence" if finished.stop_sequence is not None else "end_turn"
    sequence = finished.stop_sequence if reason == "stop_sequence" else None
    return {"stop_reason": reason, "stop_sequence": sequence}


def anthropic_usage(finished: Finished) -> dict[str, int]:
    """Anthropic's ``usage``: ``input_tokens`` excludes the prompt tokens read
    from the prompt cache, reported as ``cache_read_input_tokens`` when any were
    (Anthropic's usage fields: the prompt is their sum)."""
    usage = {
        "input_tokens": finished.prompt_tokens - finished.cached_tokens,
        "output_tokens": finished.completion_tokens,
    }
    if finished.cached_tokens:
        usage["cache_read_input_tokens"] = finished.cached_tokens
    return usage


def tool_use_id(call_id: str) -> str:
    """Anthropic's ``toolu_`` id for a chat tool call id (``call_<hex>``)."""
    return "toolu_" + call_id.removeprefix("call_")


def message_body(head: dict[str, Any], turn: ChatTurn) -> dict[str, Any]:
    """A collected turn as an Anthropic ``Message``: thinking, text, then
    tool_use blocks; empty ones are left out."""
    assert turn.finished is not None
    content: list[dict[str, Any]] = []
    if turn.reasoning:
        content.append({"type": "thinking", "thinking": turn.reasoning, "signature": ""})
    if turn.content:
        content.append({"type": "text", "text": turn.content})
    for call in turn.tool_calls:
        block = {"type": "tool_use", "id": tool_use_id(call.id), "name": call.name}
        content.append({**block, "input": _input(call.arguments)})
    return {
        **head,
        "content": content,
        **stop_fields(turn.finish_reason, turn.finished),
        "usage": anthropic_usage(turn.finished),
    }


def _input(arguments: str) -> dict[str, Any]:
    """A tool call's arguments as the ``input`` object. The parsers promise a
    JSON object; anything else (or empty text) is ``{}``, never a 500."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def _stream(turn: Turn, head: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
    """The stream's event payloads, in Anthropic's order."""
    start = {**head, "content": [], "stop_reason": None, "stop_sequence": None}
    start["usage"] = {"input_tokens": len(turn.request.prompt), "output_tokens": 0}
    yield {"type": "message_start", "message": start}
    yield {"type": "ping"}
    blocks = BlockWriter()
    async for event in turn_events(turn):
        for payload in blocks.feed(event):
            yield payload


class BlockWriter:
    """Turns the chat event stream into Anthropic content-block events.

    A block opens when the kind of output changes (text, thinking, or a new tool
    call) and closes before the next opens; indexes count blocks from 0. Tool
    argument fragments follow their call's start (the turns contract), so they
    always belong to the open block. A call cut off by the token budget
    (:class:`ToolCallCut`) keeps the input JSON it streamed, closes at the end
    like any block, and the message ends with ``stop_reason: "max_tokens"``
    (what Anthropic's API sends for a truncated ``tool_use``).
    """

    def __init__(self) -> None:
        self.count = 0
        self.open: tuple[Any, ...] | None = None

    def feed(self, event: ChatEvent) -> list[dict[str, Any]]:
        """The payloads for one chat event (possibly none).

        Returns:
            list[dict]: ``content_block_*`` payloads; for :class:`TurnEnd` the
            closing ``content_block_stop``, ``message_delta`` and ``message_stop``.
        """
        if isinstance(event, TextDelta):
            return self._delta(("text",), {"type": "text", "text": ""}, "text", event.text)
        if isinstance(event, ReasoningDelta):
            block = {"type": "thinking", "thinking": "", "signature": ""}
            return self._delta(("thinking",), block, "thinking", event.text)
        if isinstance(event, ToolCallStart):
            block = {"type": "tool_use", "id": tool_use_id(event.id), "name": event.name}
            return self._start(("tool", event.index), {**block, "input": {}})
        if isinstance(event, ToolCallArguments):
            if not event.fragment or self.open != ("tool", event.index):
                return []
            return [self._payload("input_json", "partial_json", event.fragment)]
        if isinstance(event, ToolCallCut):
            return []
        return [*self._stop(), *self._end(event)]

    def _delta(self, key: tuple, block: dict, field: str, text: str) -> list[dict[str, Any]]:
        if not text:
            return []
        out = self._start(key, block) if self.open != key else []
        return [*out, self._payload(field, field, text)]

    def _payload(self, kind: str, field: str, value: str) -> dict[str, Any]:
        delta = {"type": f"{kind}_delta", field: value}
        return {"type": "content_block_delta", "index": self.count - 1, "delta": delta}

    def _start(self, key: tuple, block: dict[str, Any]) -> list[dict[str, Any]]:
        out = self._stop()
        out.append({"type": "content_block_start", "index": self.count, "content_block": block})
        self.open, self.count = key, self.count + 1
        return out

    def _stop(self) -> list[dict[str, Any]]:
        if self.open is None:
            return []
        self.open = None
        return [{"type": "content_block_stop", "index": self.count - 1}]

    @staticmethod
    def _end(event: TurnEnd) -> list[dict[str, Any]]:
        delta = stop_fields(event.finish_reason, event.finished)
        usage = anthropic_usage(event.finished)
        return [{"type": "message_delta", "delta": delta, "usage": usage}, {"type": "message_stop"}]

"""``POST /v1/chat/completions`` (operationId ``createChatCompletion``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mlxspec.engine import EngineProtocol
from mlxspec.handlers.chat.choices import (
    ChoiceStream,
    cancel_all,
    choice_count,
    choices_usage,
    gather_choices,
    stream_chunks,
    submit_choices,
    text_framer,
)
from mlxspec.handlers.chat.logprobs import chat_chunk_logprobs, chat_logprobs, current_format
from mlxspec.handlers.common import JSON, SYSTEM_FINGERPRINT, current_engine, new_id, now
from mlxspec.handlers.turns.parser import (
    ChatTurn,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    TurnEnd,
)
from mlxspec.handlers.turns.turns import Turn, collect_turn, open_turn, turn_events
from mlxspec.http import sse


async def create_chat_completion(body: dict[str, Any]) -> Any:
    """Template the messages, generate ``n`` choices, answer as JSON or an SSE stream."""
    engine = current_engine()
    turns = await open_turns(engine, body)
    warning = turns[0].warning
    fmt = current_format()
    head = {
        "id": new_id("chatcmpl"),
        "created": now(),
        "model": engine.info.id,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    handles = [t.handle for t in turns]
    if body.get("stream"):
        streams = [_choice_chunks(turn, i, fmt) for i, turn in enumerate(turns)]
        chunks = stream_chunks(streams, _chunker(head))
        # Keep-alive comments fill silences (a withheld tool call, a long prefill).
        frames = sse.openai_events(sse.with_keepalive(chunks), on_close=cancel_all(handles))
        response = sse.event_stream(frames)
        response.headers.update(warning)
        return response
    results = await gather_choices([collect_turn(t) for t in turns], handles)
    choices = [_choice(i, t, r, fmt) for i, (t, r) in enumerate(zip(turns, results, strict=True))]
    finished = [r.finished for r in results if r.finished is not None]
    body_out = {
        **head,
        "object": "chat.completion",
        "choices": choices,
        "usage": choices_usage(finished),
    }
    return body_out, 200, {**JSON, **warning}


async def open_turns(engine: EngineProtocol, body: dict[str, Any]) -> list[Turn]:
    """Template once and submit the body's ``n`` choices (see :mod:`.choices`)."""
    n = choice_count(body)
    first = await open_turn(engine, body, group=n)  # admits all n choices, or none
    runs = submit_choices(engine, first.request, first.handle, n, "messages")
    return [dataclasses.replace(first, request=request, handle=handle) for request, handle in runs]


def _chunker(head: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any] | bytes]:
    """Wraps a choice object into a ``chat.completion.chunk``; a bare content
    delta (the per-token chunk) comes out already framed (:func:`.choices.text_framer`)."""

    def wrap(choice: dict[str, Any]) -> dict[str, Any]:
        return {**head, "object": "chat.completion.chunk", "choices": [choice]}

    def content(choice: dict[str, Any]) -> str | None:
        delta = choice["delta"]
        if choice["logprobs"] is not None or choice["finish_reason"] is not None:
            return None
        return delta["content"] if len(delta) == 1 and "content" in delta else None

    def slotted(choice: dict[str, Any]) -> dict[str, Any]:
        return {**choice, "delta": {"content": sse.SLOT}}

    return text_framer(wrap, content, slotted)


def _choice(index: int, turn: Turn, result: ChatTurn, fmt: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.reasoning is not None:
        message["reasoning"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = [_tool_call(call) for call in result.tool_calls]
    return {
        "index": index,
        "message": message,
        "logprobs": chat_logprobs(turn.request, result.logprobs, fmt),
        "finish_reason": result.finish_reason,
    }


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


async def _choice_chunks(turn: Turn, index: int, fmt: str) -> ChoiceStream:
    """One choice's stream: ``(choice, Finished or None)`` pairs: role delta,
    content / reasoning / tool-call deltas, then the finish_reason chunk.
    In the ``openai`` logprobs format, deltas carry their tokens' logprobs."""

    def choice(delta: dict[str, Any], finish: str | None = None, lps: Any = ()) -> dict:
        logprobs = chat_chunk_logprobs(turn.request, lps, fmt)
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    yield choice({"role": "assistant", "content": ""}), None
    async for event in turn_events(turn):
        if isinstance(event, TurnEnd):
            yield choice({}, event.finish_reason), event.finished
        elif isinstance(event, TextDelta):
            # Tokens whose text is held back (partial UTF-8, a possible stop
            # string) still report their logprobs, under an empty content delta.
            if event.text or chat_chunk_logprobs(turn.request, event.logprobs, fmt):
                yield choice({"content": event.text}, lps=event.logprobs), None
        elif isinstance(event, ReasoningDelta):
            yield choice({"reasoning": event.text}, lps=event.logprobs), None
        elif isinstance(event, ToolCallStart):
            call = {"index": event.index, "id": event.id, "type": "function"}
            call["function"] = {"name": event.name, "arguments": ""}
            yield choice({"tool_calls": [call]}), None
        elif isinstance(event, ToolCallArguments):
            fragment = {"index": event.index, "function": {"arguments": event.fragment}}
            yield choice({"tool_calls": [fragment]}, lps=event.logprobs), None

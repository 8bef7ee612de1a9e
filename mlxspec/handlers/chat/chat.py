"""``POST /v1/chat/completions`` (operationId ``createChatCompletion``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlxspec.handlers.chat.choices import ChoiceStream, choices_usage, stream_chunks, usage_apart
from mlxspec.handlers.chat.logprobs import chat_chunk_logprobs, chat_logprobs
from mlxspec.handlers.context import (
    JSON,
    SYSTEM_FINGERPRINT,
    current_engine,
    logprobs_format,
    new_id,
    now,
    stream_usage_always,
)
from mlxspec.handlers.events import cancel_all, gather_choices
from mlxspec.handlers.turns.parser import (
    ChatTurn,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    TurnEnd,
)
from mlxspec.handlers.turns.turns import Turn, collect_turn, open_turns, turn_events
from mlxspec.http import sse


async def create_chat_completion(body: dict[str, Any]) -> Any:
    """Template the messages, generate ``n`` choices, answer as JSON or an SSE stream."""
    engine, fmt = current_engine(), logprobs_format()
    head = {
        "id": new_id("chatcmpl"),
        "created": now(),
        "model": engine.info.id,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    turns = await open_turns(engine, body)
    warning = turns[0].warning
    handles = [t.handle for t in turns]
    if body.get("stream"):
        streams = [_choice_chunks(turn, i, fmt) for i, turn in enumerate(turns)]
        apart = usage_apart(body, {**head, "object": "chat.completion.chunk"})
        chunks = stream_chunks(streams, _chunker(head), apart, stream_usage_always())
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


#: A per-token choice of a chat stream: a bare content delta.
_TEXT_CHOICE = {"delta": {"content": sse.SLOT}, "logprobs": None, "finish_reason": None}


def _chunker(head: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any] | bytes]:
    """Wraps a choice object into a ``chat.completion.chunk``; a bare content
    delta (the per-token chunk) comes out already framed (:func:`.sse.chunk_framer`)."""
    return sse.chunk_framer({**head, "object": "chat.completion.chunk"}, _TEXT_CHOICE)


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

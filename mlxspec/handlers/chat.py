"""``POST /v1/chat/completions`` (operationId ``createChatCompletion``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from mlxspec import sse

from .common import JSON, SYSTEM_FINGERPRINT, choice_logprobs, current_engine, new_id, now, usage
from .turns import (
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    Turn,
    TurnEnd,
    collect_turn,
    open_turn,
    turn_events,
)


async def create_chat_completion(body: dict[str, Any]) -> Any:
    """Template the messages, generate, and answer as JSON or an SSE stream."""
    engine = current_engine()
    turn = open_turn(engine, body)
    head = {
        "id": new_id("chatcmpl"),
        "created": now(),
        "model": engine.info.id,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    if body.get("stream"):
        chunks = sse.with_keepalive(_chunks(turn, head))
        frames = sse.openai_events(chunks, on_close=turn.handle.cancel)
        return sse.event_stream(frames)
    result = await collect_turn(turn)
    assert result.finished is not None
    message: dict[str, Any] = {"role": "assistant", "content": result.content}
    if result.reasoning is not None:
        message["reasoning"] = result.reasoning
    if result.tool_calls:
        message["tool_calls"] = [_tool_call(call) for call in result.tool_calls]
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "logprobs": choice_logprobs(turn.request, result.logprobs),
        "finish_reason": result.finish_reason,
    }
    body_out = {
        **head,
        "object": "chat.completion",
        "choices": [choice],
        "usage": usage(result.finished),
    }
    return body_out, 200, JSON


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
    }


async def _chunks(turn: Turn, head: dict[str, Any]) -> AsyncIterator[dict]:
    """``chat.completion.chunk`` payloads: role delta, content / reasoning /
    tool-call deltas, final chunk with finish_reason and usage."""

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "object": "chat.completion.chunk", "choices": [choice], **extra}

    yield chunk({"role": "assistant", "content": ""})
    async for event in turn_events(turn):
        if isinstance(event, TurnEnd):
            yield chunk({}, event.finish_reason, usage=usage(event.finished))
        elif isinstance(event, TextDelta):
            if event.text:
                yield chunk({"content": event.text})
        elif isinstance(event, ReasoningDelta):
            yield chunk({"reasoning": event.text})
        elif isinstance(event, ToolCallStart):
            call = {"index": event.index, "id": event.id, "type": "function"}
            call["function"] = {"name": event.name, "arguments": ""}
            yield chunk({"tool_calls": [call]})
        elif isinstance(event, ToolCallArguments):
            fragment = {"index": event.index, "function": {"arguments": event.fragment}}
            yield chunk({"tool_calls": [fragment]})

"""``POST /v1/chat/completions`` (operationId ``createChatCompletion``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from mlxspec import sse
from mlxspec.engine import Finished, RequestHandle

from .common import (
    JSON,
    SYSTEM_FINGERPRINT,
    choice_logprobs,
    collect,
    current_engine,
    new_id,
    now,
    outputs,
    to_generation_request,
    usage,
)


async def create_chat_completion(body: dict[str, Any]) -> Any:
    """Template the messages, generate, and answer as JSON or an SSE stream."""
    engine = current_engine()
    prompt = engine.chat_prompt(
        body["messages"], body.get("tools"), body.get("chat_template_kwargs")
    )
    request = to_generation_request(body, prompt, engine.defaults, engine.info)
    handle = engine.submit(request)
    head = {
        "id": new_id("chatcmpl"),
        "created": now(),
        "model": engine.info.id,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    if body.get("stream"):
        frames = sse.openai_events(_chunks(handle, head), on_close=handle.cancel)
        return sse.event_stream(frames)
    result = await collect(handle)
    assert result.finished is not None
    choice: dict[str, Any] = {
        "index": 0,
        "message": {"role": "assistant", "content": result.text},
        "logprobs": choice_logprobs(request, result.logprobs),
        "finish_reason": result.finished.finish_reason,
    }
    body_out = {
        **head,
        "object": "chat.completion",
        "choices": [choice],
        "usage": usage(result.finished),
    }
    return body_out, 200, JSON


async def _chunks(handle: RequestHandle, head: dict[str, Any]) -> AsyncIterator[dict]:
    """``chat.completion.chunk`` payloads: role delta, content deltas, final chunk."""

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {**head, "object": "chat.completion.chunk", "choices": [choice], **extra}

    yield chunk({"role": "assistant", "content": ""})
    async for event in outputs(handle):
        if isinstance(event, Finished):
            yield chunk({}, event.finish_reason, usage=usage(event))
        elif event.text:
            yield chunk({"content": event.text})

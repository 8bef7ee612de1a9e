"""``POST /v1/completions`` (operationId ``createCompletion``): raw text, no template."""

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
from .structured import structured_output


async def create_completion(body: dict[str, Any]) -> Any:
    """Tokenize ``prompt`` as mlx-lm does, generate, answer as JSON or SSE."""
    engine = current_engine()
    body, warning = await structured_output(engine, body, chat=False)
    prompt = engine.text_prompt(body["prompt"])
    request = to_generation_request(body, prompt, engine.defaults, engine.info)
    handle = engine.submit(request, prompt_param="prompt")
    head = {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": now(),
        "model": engine.info.id,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    if body.get("stream"):
        frames = sse.openai_events(_chunks(handle, head), on_close=handle.cancel)
        response = sse.event_stream(frames)
        response.headers.update(warning)
        return response
    result = await collect(handle)
    assert result.finished is not None
    choice: dict[str, Any] = {
        "index": 0,
        "text": result.text,
        "logprobs": choice_logprobs(request, result.logprobs),
        "finish_reason": result.finished.finish_reason,
    }
    return {**head, "choices": [choice], "usage": usage(result.finished)}, 200, {**JSON, **warning}


async def _chunks(handle: RequestHandle, head: dict[str, Any]) -> AsyncIterator[dict]:
    """``text_completion`` chunks: text deltas, then one with finish_reason and usage."""

    def chunk(text: str, finish: str | None = None, **extra: Any) -> dict:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**head, "choices": [choice], **extra}

    async for event in outputs(handle):
        if isinstance(event, Finished):
            yield chunk("", event.finish_reason, usage=usage(event))
        elif event.text:
            yield chunk(event.text)

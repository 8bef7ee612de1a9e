"""``POST /v1/completions`` (operationId ``createCompletion``): raw text, no template.

The text continues the prompt verbatim: a completion that starts with a space
keeps it (``"The capital of France is"`` -> ``" Paris."``), so prompt + text
reads as one string and ``text_offset`` indexes ``text``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mlxspec.engine import (
    EngineProtocol,
    Finished,
    GenerationRequest,
    RequestHandle,
    off_loop,
    token_prompt,
)
from mlxspec.handlers.adapters.select import request_adapters
from mlxspec.handlers.chat.choices import ChoiceStream, choices_usage, stream_chunks, usage_apart
from mlxspec.handlers.chat.logprobs import CompletionLogprobs
from mlxspec.handlers.context import (
    JSON,
    SYSTEM_FINGERPRINT,
    current_engine,
    logprobs_format,
    new_id,
    now,
    request_headers,
    stream_usage_always,
)
from mlxspec.handlers.events import cancel_all, collect, gather_choices, outputs, submit_choices
from mlxspec.handlers.requests import (
    choice_count,
    choice_requests,
    session_key,
    to_generation_request,
)
from mlxspec.handlers.turns.structured import structured_output
from mlxspec.http import sse


async def create_completion(body: dict[str, Any]) -> Any:
    """Tokenize ``prompt`` as mlx-lm does (or take its token ids), generate ``n``
    choices, answer as JSON or SSE."""
    engine, fmt, headers = current_engine(), logprobs_format(), request_headers()
    adapter = request_adapters(engine, body)  # an unknown id is a 400 before any work
    head = {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": now(),
        "model": engine.info.id,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    body, warning = await structured_output(engine, body, chat=False)
    prompt = await off_loop(prompt_tokens, engine, body["prompt"])
    session = session_key(body, headers)
    first = to_generation_request(body, prompt, engine.defaults, engine.info, session, adapter)
    # The output continues the prompt's text, so a leading space is kept
    # (OpenAI and vLLM do; mlx_lm.server trims it: docs/deviations.md).
    first = dataclasses.replace(first, continuation=True)
    requests = choice_requests(first, choice_count(body))
    handles = submit_choices(engine, requests, "prompt")  # all n choices, or none
    runs = list(zip(requests, handles, strict=True))
    if body.get("stream"):
        streams = [_choice_chunks(req, handle, i, fmt) for i, (req, handle) in enumerate(runs)]
        apart = usage_apart(body, head)
        chunks = stream_chunks(streams, _chunker(head), apart, stream_usage_always())
        response = sse.event_stream(sse.openai_events(chunks, on_close=cancel_all(handles)))
        response.headers.update(warning)
        return response
    results = await gather_choices([collect(h) for h in handles], handles)
    choices = []
    for index, ((request, _), result) in enumerate(zip(runs, results, strict=True)):
        assert result.finished is not None
        choices.append(
            {
                "index": index,
                "text": result.text,
                "logprobs": CompletionLogprobs(request, fmt).whole(result.logprobs),
                "finish_reason": result.finished.finish_reason,
            }
        )
    finished = [r.finished for r in results if r.finished is not None]
    out = {**head, "choices": choices, "usage": choices_usage(finished)}
    return out, 200, {**JSON, **warning}


def prompt_tokens(engine: EngineProtocol, prompt: str | list) -> list[int]:
    """The token ids of a validated ``prompt`` (a prompt thread's work).

    The document admits OpenAI's shapes of one prompt: a string, tokenized as
    ``mlx_lm.server`` does; a list of token ids, used as given; or a
    one-element list holding either (the batch form with one entry).

    Args:
        engine (EngineProtocol): the serving engine (its text prompts and vocabulary size).
        prompt (str | list): the body's ``prompt``.

    Returns:
        list[int]: the prompt's token ids.

    Raises:
        PromptError: the string encodes to no tokens, or a token id is not one
            of the model's.
    """
    if isinstance(prompt, list) and len(prompt) == 1 and not isinstance(prompt[0], int):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return engine.text_prompt(prompt)
    return token_prompt(prompt, engine.info.vocab_size)


#: A per-token choice of a text completion stream: text without logprobs.
_TEXT_CHOICE = {"text": sse.SLOT, "logprobs": None, "finish_reason": None}


def _chunker(head: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any] | bytes]:
    """Wraps a choice object into a ``text_completion`` chunk; a text chunk
    without logprobs (the per-token chunk) comes out already framed
    (:func:`.sse.chunk_framer`)."""
    return sse.chunk_framer(head, _TEXT_CHOICE)


async def _choice_chunks(
    request: GenerationRequest, handle: RequestHandle, index: int, fmt: str
) -> ChoiceStream:
    """One choice's ``(choice, Finished or None)`` pairs: text deltas (with
    their tokens' logprobs in the ``openai`` format), then the finish_reason."""
    logprobs = CompletionLogprobs(request, fmt)

    def choice(text: str, finish: str | None = None, lps: Any = None) -> dict:
        return {"index": index, "text": text, "logprobs": lps, "finish_reason": finish}

    async for event in outputs(handle):
        if isinstance(event, Finished):
            yield choice("", event.finish_reason), event
            continue
        lps = logprobs.chunk(event.logprobs)
        if event.text or lps is not None:
            yield choice(event.text, lps=lps), None

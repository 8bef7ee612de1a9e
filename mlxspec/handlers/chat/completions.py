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
    Engine,
    Finished,
    GenerationRequest,
    RequestHandle,
    off_loop,
    token_prompt,
)
from mlxspec.handlers.adapters.select import request_adapters
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
from mlxspec.handlers.chat.logprobs import CompletionLogprobs, current_format
from mlxspec.handlers.common import (
    JSON,
    SYSTEM_FINGERPRINT,
    collect,
    current_engine,
    new_id,
    now,
    outputs,
    request_headers,
    session_key,
    to_generation_request,
)
from mlxspec.handlers.turns.structured import structured_output
from mlxspec.http import sse


async def create_completion(body: dict[str, Any]) -> Any:
    """Tokenize ``prompt`` as mlx-lm does (or take its token ids), generate ``n``
    choices, answer as JSON or SSE."""
    engine = current_engine()
    adapter = request_adapters(engine, body)  # an unknown id is a 400 before any work
    body, warning = await structured_output(engine, body, chat=False)
    prompt = await off_loop(prompt_tokens, engine, body["prompt"])
    session = session_key(body, request_headers())
    first = to_generation_request(body, prompt, engine.defaults, engine.info, session, adapter)
    # The output continues the prompt's text, so a leading space is kept
    # (OpenAI and vLLM do; mlx_lm.server trims it: docs/deviations.md).
    first = dataclasses.replace(first, continuation=True)
    n = choice_count(body)
    handle = engine.submit(first, prompt_param="prompt", group=n)  # all n choices, or none
    runs = submit_choices(engine, first, handle, n, "prompt")
    handles = [handle for _, handle in runs]
    fmt = current_format()
    head = {
        "id": new_id("cmpl"),
        "object": "text_completion",
        "created": now(),
        "model": engine.info.id,
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }
    if body.get("stream"):
        streams = [_choice_chunks(req, handle, i, fmt) for i, (req, handle) in enumerate(runs)]
        chunks = stream_chunks(streams, _chunker(head))
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


def prompt_tokens(engine: Engine, prompt: str | list) -> list[int]:
    """The token ids of a validated ``prompt`` (a prompt thread's work).

    The document admits OpenAI's shapes of one prompt: a string, tokenized as
    ``mlx_lm.server`` does; a list of token ids, used as given; or a
    one-element list holding either (the batch form with one entry).

    Args:
        engine (Engine): the serving engine (its tokenizer and vocabulary size).
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


def _chunker(head: dict[str, Any]) -> Callable[[dict[str, Any]], dict[str, Any] | bytes]:
    """Wraps a choice object into a ``text_completion`` chunk; a text chunk
    without logprobs (the per-token chunk) comes out already framed
    (:func:`.choices.text_framer`)."""

    def wrap(choice: dict[str, Any]) -> dict[str, Any]:
        return {**head, "choices": [choice]}

    def text(choice: dict[str, Any]) -> str | None:
        plain = choice["logprobs"] is None and choice["finish_reason"] is None
        return choice["text"] if plain else None

    return text_framer(wrap, text, lambda choice: {**choice, "text": sse.SLOT})


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

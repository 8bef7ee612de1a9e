"""The reply of ``n`` choices, shared by chat and text completions: their
streams merged into one, and ``usage`` over all of them.

Each choice is its own engine request on the same prompt
(:func:`~mlxspec.handlers.requests.choice_requests`, submitted as one group by
:func:`~mlxspec.handlers.events.submit_choices`); the engine batches them
(continuous batching), so they decode together. The requests are marked
``shared_prefill``: the batched lane prefills the prompt once into the prompt
cache and every choice starts from that KV cache.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from mlxspec.engine import Fill, Finished, Speculation

T = TypeVar("T")


async def merge(streams: Sequence[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Interleave the choices' streams as their items arrive.

    Args:
        streams (Sequence[AsyncIterator]): one per choice.

    Yields:
        tuple[int, T]: ``(choice index, item)``; each stream's items keep their order.

    Raises:
        Exception: the first error any stream raises (the others are stopped).
    """
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, Any, BaseException | None]] = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item, None))
        except Exception as exc:  # handed to the consumer, which re-raises it
            await queue.put((index, None, exc))
            return
        await queue.put((index, done, None))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    running = len(tasks)
    try:
        while running:
            index, item, error = await queue.get()
            if error is not None:
                raise error
            if item is done:
                running -= 1
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


#: One choice's stream: ``(choice object, Finished or None)`` pairs; the
#: ``Finished`` rides the pair holding that choice's finish_reason.
ChoiceStream = AsyncIterator[tuple[dict[str, Any], Finished | None]]


async def stream_chunks(
    streams: Sequence[ChoiceStream],
    chunk: Callable[[dict[str, Any]], dict[str, Any] | bytes],
    usage_apart: dict[str, Any] | None = None,
    usage_on_finish: bool = False,
) -> AsyncIterator[dict[str, Any] | bytes]:
    """The chunks of a streamed response with ``n`` choices.

    Args:
        streams (Sequence[ChoiceStream]): one per choice, in index order.
        chunk (Callable): wraps one choice object into a chunk (``id``,
            ``object``, ...), or into its SSE frame already (``bytes``), as
            :func:`mlxspec.http.sse.chunk_framer` does; a choice that finishes
            must come back as a ``dict`` (it may get ``usage``).
        usage_apart (dict | None): with ``stream_options.include_usage``, the
            chunk fields (``id``, ``object``, ...) of a last chunk of its own
            that carries ``usage`` with ``choices: []``, as OpenAI sends it.
            Default: ``None`` (no such chunk).
        usage_on_finish (bool): without ``usage_apart``, put ``usage`` on the
            chunk that finishes the last choice (``--stream-usage always``, the
            reference's superset). Default: ``False`` (OpenAI: no usage unasked).

    Yields:
        dict | bytes: one chunk per choice object, interleaved as they arrive;
        ``usage`` over all choices in one more chunk after them
        (``usage_apart``), or on the chunk that finishes the last one
        (``usage_on_finish``), never on both; else nowhere.
    """
    finished: list[Finished | None] = [None] * len(streams)
    async for index, (choice, end) in merge(streams):
        out = chunk(choice)
        if end is not None:
            assert isinstance(out, dict)
            finished[index] = end
            done = [f for f in finished if f is not None]
            if len(done) == len(finished) and usage_apart is None and usage_on_finish:
                out["usage"] = choices_usage(done)
        yield out
    done = [f for f in finished if f is not None]
    if usage_apart is not None and len(done) == len(finished):
        yield {**usage_apart, "choices": [], "usage": choices_usage(done)}


def usage_apart(body: dict[str, Any], fields: dict[str, Any]) -> dict[str, Any] | None:
    """:func:`stream_chunks`' ``usage_apart``: ``fields`` when the body asks for
    ``stream_options.include_usage``, else ``None``."""
    options = body.get("stream_options") or {}
    return fields if options.get("include_usage") is True else None


def choices_usage(finished: Sequence[Finished]) -> dict[str, Any]:
    """``usage`` over all choices: the prompt counted once (choice 0's counts),
    completion tokens summed; ``lane`` is ``batched`` if any choice was batched."""
    first = finished[0]
    lanes = [f.lane for f in finished]
    specs = [f.speculation for f in finished if f.speculation is not None]
    total = replace(
        first,
        completion_tokens=sum(f.completion_tokens for f in finished),
        lane=next((lane for lane in ("batched", "serial+spec") if lane in lanes), first.lane),
        speculation=Speculation(
            sum(s.drafted for s in specs),
            sum(s.accepted for s in specs),
            sum(s.target_calls for s in specs),
        )
        if specs
        else None,
        fill=_sum_fills([f.fill for f in finished if f.fill is not None]),
    )
    return usage(total)


def _sum_fills(fills: Sequence[Fill]) -> Fill | None:
    """The choices' fill counts added up (spans in choice order), ``None`` if none."""
    if not fills:
        return None
    return Fill(
        events=sum(f.events for f in fills),
        injected=sum(f.injected for f in fills),
        span_lens=tuple(n for f in fills for n in f.span_lens),
        truncated=sum(f.truncated for f in fills),
        decode_steps=sum(f.decode_steps for f in fills),
        verify_events=sum(f.verify_events for f in fills),
        verify_accepted=sum(f.verify_accepted for f in fills),
        verify_rejected=sum(f.verify_rejected for f in fills),
        checkpoint_ms=round(sum(f.checkpoint_ms for f in fills), 3),
    )


def fill_usage(fill: Fill) -> dict[str, Any]:
    """``usage.fill`` in the reference's fields. Its ``echo``, ``wastedSamples``,
    ``parseFallback``, ``verifyUnsupported`` and ``branchStops`` are always 0:
    there is no echo index, and a span is checked, never asserted, so no
    in-flight sample is dropped and every span reaches a rewindable cache."""
    return {
        "events": fill.events,
        "injected": fill.injected,
        "strict": fill.injected,
        "echo": 0,
        "spanLens": list(fill.span_lens),
        "wastedSamples": 0,
        "parseFallback": 0,
        "indexTruncated": fill.truncated,
        "decodeSteps": fill.decode_steps,
        "verifyEvents": fill.verify_events,
        "verifyAccepted": fill.verify_accepted,
        "verifyRejected": fill.verify_rejected,
        "verifyUnsupported": 0,
        "checkpointMs": fill.checkpoint_ms,
        "branchStops": 0,
    }


def usage(finished: Finished) -> dict[str, Any]:
    """The ``usage`` object: OpenAI's fields plus ``prompt_tokens_details``,
    ``lane`` and, for a request that could speculate, ``speculation``; for one
    that could fill (``--fill strict``), ``fill``."""
    out: dict[str, Any] = {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finished.cached_tokens},
        "lane": finished.lane,
    }
    spec = finished.speculation
    if spec is not None:
        out["speculation"] = {
            "drafted": spec.drafted,
            "accepted": spec.accepted,
            "targetCalls": spec.target_calls,
        }
    if finished.fill is not None:
        out["fill"] = fill_usage(finished.fill)
    return out

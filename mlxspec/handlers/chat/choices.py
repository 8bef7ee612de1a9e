"""``n`` choices per request, shared by chat and text completions.

Each choice is its own engine request on the same prompt; the engine batches
them (continuous batching), so they decode together. The requests are marked
``shared_prefill``: the batched lane prefills the prompt once into the prompt
cache and every choice starts from that KV cache. With a
``seed``, choice i samples with ``seed + i`` so the choices differ and the
whole request stays reproducible; greedy decoding gives n identical choices.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

from mlxspec.engine import EngineProtocol, Finished, GenerationRequest, RequestHandle
from mlxspec.handlers.common import usage
from mlxspec.http import sse

T = TypeVar("T")

#: ``mx.random.seed`` takes an unsigned 64-bit integer.
_SEED_SPACE = 2**64


def choice_count(body: Mapping[str, Any]) -> int:
    """``n`` of a validated body (omitted or null is 1; the document bounds it)."""
    return int(body.get("n") or 1)


def choice_request(request: GenerationRequest, index: int) -> GenerationRequest:
    """The engine request of choice ``index``: ``request`` with the seed moved
    to ``seed + index`` (mod 2**64) when one is set, else ``request`` itself."""
    seed = request.sampling.seed
    if seed is None or index == 0:
        return request
    sampling = replace(request.sampling, seed=(seed + index) % _SEED_SPACE)
    return replace(request, sampling=sampling)


def submit_choices(
    engine: EngineProtocol,
    first: GenerationRequest,
    first_handle: RequestHandle,
    n: int,
    prompt_param: str,
) -> list[tuple[GenerationRequest, RequestHandle]]:
    """Submit choices 1..n-1 next to choice 0, which the caller already submitted
    heading a group of ``n`` (``Engine.submit(..., group=n)``), in the same
    event-loop turn: the engine admitted all ``n`` then, so these skip the
    queue checks (a partly submitted group once pushed other requests out and
    counted its cancelled members as cancelled generations).

    Args:
        engine (EngineProtocol): the serving engine.
        first (GenerationRequest): choice 0's request.
        first_handle (RequestHandle): choice 0's handle.
        n (int): the number of choices.
        prompt_param (str): the request field named in prompt errors.

    Returns:
        list: ``(request, handle)`` of every choice, in index order.

    Raises:
        ContextLengthError: as ``Engine.submit``; every handle submitted so
            far, choice 0's included, is cancelled first.
    """
    out = [(first, first_handle)]
    try:
        for index in range(1, n):
            request = choice_request(first, index)
            handle = engine.submit(request, prompt_param=prompt_param, admitted=True)
            out.append((request, handle))
    except BaseException:
        for _, handle in out:
            handle.cancel()
        raise
    return out


async def gather_choices(
    collects: Sequence[Awaitable[T]], handles: Sequence[RequestHandle]
) -> list[T]:
    """Await every choice's collection; if one fails, cancel all the handles
    (so no engine request outlives the HTTP request) and re-raise."""
    try:
        return list(await asyncio.gather(*collects))
    except BaseException:
        for handle in handles:
            handle.cancel()
        raise


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


def cancel_all(handles: Sequence[RequestHandle]) -> Callable[[], None]:
    """A callback cancelling every choice's engine request (a stream's ``on_close``)."""

    def cancel() -> None:
        for handle in handles:
            handle.cancel()

    return cancel


#: One choice's stream: ``(choice object, Finished or None)`` pairs; the
#: ``Finished`` rides the pair holding that choice's finish_reason.
ChoiceStream = AsyncIterator[tuple[dict[str, Any], Finished | None]]


async def stream_chunks(
    streams: Sequence[ChoiceStream],
    chunk: Callable[[dict[str, Any]], dict[str, Any] | bytes],
) -> AsyncIterator[dict[str, Any] | bytes]:
    """The chunks of a streamed response with ``n`` choices.

    Args:
        streams (Sequence[ChoiceStream]): one per choice, in index order.
        chunk (Callable): wraps one choice object into a chunk (``id``,
            ``object``, ...), or into its SSE frame already (``bytes``); a
            choice that finishes must come back as a ``dict`` (it may get ``usage``).

    Yields:
        dict | bytes: one chunk per choice object, interleaved as they arrive;
        the chunk that finishes the last choice also carries ``usage`` over all choices.
    """
    finished: list[Finished | None] = [None] * len(streams)
    async for index, (choice, end) in merge(streams):
        out = chunk(choice)
        if end is not None:
            assert isinstance(out, dict)
            finished[index] = end
            done = [f for f in finished if f is not None]
            if len(done) == len(finished):
                out["usage"] = choices_usage(done)
        yield out


def text_framer(
    wrap: Callable[[dict[str, Any]], dict[str, Any]],
    text_of: Callable[[dict[str, Any]], str | None],
    slotted: Callable[[dict[str, Any]], dict[str, Any]],
) -> Callable[[dict[str, Any]], dict[str, Any] | bytes]:
    """A ``chunk`` for :func:`stream_chunks` that frames per-token chunks from
    a template: only their text is serialised each time, and the bytes equal
    framing ``wrap(choice)`` (:class:`mlxspec.http.sse.FrameTemplate`).

    Args:
        wrap (Callable): choice object -> chunk.
        text_of (Callable): the choice's text when it is a plain text chunk
            (only the text varies between such chunks of one choice), else ``None``.
        slotted (Callable): the choice with :data:`mlxspec.http.sse.SLOT` in place of its text.

    Returns:
        Callable: choice -> the framed chunk (``bytes``) or ``wrap(choice)``.
    """
    templates: dict[int, sse.FrameTemplate] = {}

    def chunk(choice: dict[str, Any]) -> dict[str, Any] | bytes:
        text = text_of(choice)
        if text is None:
            return wrap(choice)
        template = templates.get(choice["index"])
        if template is None:
            template = templates[choice["index"]] = sse.FrameTemplate(wrap(slotted(choice)))
        return template.frame(text)

    return chunk


def choices_usage(finished: Sequence[Finished]) -> dict[str, Any]:
    """``usage`` over all choices: the prompt counted once (choice 0's counts),
    completion tokens summed; ``lane`` is ``batched`` if any choice was batched."""
    first = finished[0]
    total = replace(
        first,
        completion_tokens=sum(f.completion_tokens for f in finished),
        lane="batched" if any(f.lane == "batched" for f in finished) else first.lane,
    )
    return usage(total)

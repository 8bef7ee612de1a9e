"""EngineProtocol requests on the handler side: submitted, read, cancelled.

:func:`submit_choices` submits a body's choices as one admission group;
:func:`outputs` reads a handle's events, turning the engine's failure events
into errors (:func:`~mlxspec.errors.from_failure`) and feeding the app's
latency metrics; :func:`collect` gathers a whole generation. A client that
disconnects cancels its engine work (:func:`cancel_on_disconnect`,
:func:`until_disconnect`, :func:`cancel_all`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from connexion.context import receive

from mlxspec.engine import (
    Cancelled,
    Delta,
    EngineProtocol,
    Failed,
    Finished,
    GenerationRequest,
    RequestHandle,
    TokenLogprob,
)
from mlxspec.errors import from_failure
from mlxspec.handlers.context import current_metrics
from mlxspec.http.metrics import GenerationWatch

T = TypeVar("T")


def submit_choices(
    engine: EngineProtocol, requests: Sequence[GenerationRequest], prompt_param: str
) -> list[RequestHandle]:
    """Submit the requests of a body's choices as one admission group.

    Choice 0 heads a group of ``n`` (``Engine.submit(..., group=n)``): the
    engine admits all ``n`` or none, and the others follow in the same
    event-loop turn, skipping the queue checks (a partly submitted group once
    pushed other requests out and counted its cancelled members as cancelled
    generations).

    Args:
        engine (EngineProtocol): the serving engine.
        requests (Sequence[GenerationRequest]): one per choice, in index order
            (:func:`~mlxspec.handlers.requests.choice_requests`).
        prompt_param (str): the request field named in prompt errors.

    Returns:
        list[RequestHandle]: one per choice, in index order.

    Raises:
        ContextLengthError, QueueFullError: as ``Engine.submit``; every handle
            submitted so far is cancelled first.
    """
    first, *others = requests
    handles = [engine.submit(first, prompt_param=prompt_param, group=len(requests))]
    try:
        for request in others:
            handles.append(engine.submit(request, prompt_param=prompt_param, admitted=True))
    except BaseException:
        for handle in handles:
            handle.cancel()
        raise
    return handles


async def outputs(handle: RequestHandle) -> AsyncIterator[Delta | Finished]:
    """A handle's ``Delta`` and ``Finished`` events; the failure events become errors.

    Every surface reads its events here, so this is where the app's metrics
    observe time to first token, inter-token latency and token counts.

    Raises:
        ApiError: ``Failed`` or ``Cancelled``, as :func:`~mlxspec.errors.from_failure` maps it.
    """
    watch = _watch(handle)
    async for event in handle:
        if isinstance(event, (Failed, Cancelled)):
            raise from_failure(event)
        if watch is not None:
            watch.observe(event)
        yield event


def _watch(handle: RequestHandle) -> GenerationWatch | None:
    """The app's latency/token watch for ``handle`` (see :func:`current_metrics`)."""
    metrics = current_metrics()
    return metrics.watch(handle) if metrics is not None else None


@dataclass
class Collected:
    """A whole generation gathered from a handle's events."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: Finished | None = None


async def collect(handle: RequestHandle) -> Collected:
    """Gather a non-streamed generation. A client that disconnects, or a
    cancelled awaiting task, cancels the engine request.

    Raises:
        ApiError: ``server_error`` when the engine reports a failure.
    """
    out, pieces = Collected(), []
    watcher = asyncio.ensure_future(cancel_on_disconnect(handle))
    try:
        async for event in outputs(handle):
            if isinstance(event, Delta):
                pieces.append(event.text)
                out.logprobs.extend(event.logprobs)
            else:
                out.finished = event
    except asyncio.CancelledError:
        handle.cancel()
        raise
    finally:
        watcher.cancel()
    out.text = "".join(pieces)
    return out


async def cancel_on_disconnect(handle: RequestHandle) -> None:
    """Wait for the client's ``http.disconnect`` and cancel ``handle``.

    The body was already read by validation, so the next ASGI message for a
    plain request is the disconnect (ASGI HTTP spec, "Disconnected").
    """
    while (await receive())["type"] != "http.disconnect":
        pass
    handle.cancel()


async def until_disconnect(work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first (then cancel it).

    For handlers whose engine work is not a :class:`RequestHandle` (scoring,
    embeddings through ``Engine.run_exclusive``).

    Raises:
        ApiError: ``cancelled`` when the client left first.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task not in done:
        raise from_failure(Cancelled())
    return task.result()


async def _disconnected() -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


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


def cancel_all(handles: Sequence[RequestHandle]) -> Callable[[], None]:
    """A callback cancelling every choice's engine request (a stream's ``on_close``)."""

    def cancel() -> None:
        for handle in handles:
            handle.cancel()

    return cancel

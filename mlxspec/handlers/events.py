"""Engine requests on the handler side: read, and cancelled when the client leaves.

:func:`outputs` reads a handle's events, turning the engine's failure events
into errors (:func:`~mlxspec.errors.from_failure`) and feeding the app's
latency metrics; :func:`collect` gathers a whole generation. A client that
disconnects cancels its engine work (:func:`cancel_on_disconnect`,
:func:`until_disconnect`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import TypeVar

from connexion.context import receive

from mlxspec.engine import (
    Cancelled,
    Delta,
    Failed,
    Finished,
    RequestHandle,
    TokenLogprob,
)
from mlxspec.errors import from_failure
from mlxspec.handlers.context import current_metrics
from mlxspec.http.metrics import GenerationWatch

T = TypeVar("T")


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

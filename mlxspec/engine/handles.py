"""What a caller holds for queued engine work: a generation's event stream, or
one exclusive MLX job (both run on the engine thread, :mod:`.generator`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from .types import Cancelled, Event, Failed, Finished, GenerationRequest


class RequestHandle:
    """A submitted request: an async iterator of events, and ``cancel()``.

    Events are pushed from the engine thread with ``loop.call_soon_threadsafe``;
    iteration ends after ``Finished``, ``Failed`` or ``Cancelled``.
    """

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self._loop = loop
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()
        #: ``time.monotonic()`` at submission, for time-to-first-token.
        self.submitted_at = time.monotonic()

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop this request: the engine drops it at its next decode step and
        iteration ends with ``Cancelled``. Safe from any thread, idempotent."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self.emit(Cancelled())

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to the request's loop (engine thread side)."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the client is gone
            self._cancelled.set()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, (Finished, Failed, Cancelled)):
                return


class ExclusiveJob:
    """A callable queued to run alone on the engine thread (see ``run_exclusive``)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.future = fn, concurrent.futures.Future()

    def run(self) -> None:
        # A caller that stopped waiting cancelled the future: skip the work.
        if self.future.set_running_or_notify_cancel():
            try:
                self.future.set_result(self.fn())
            except Exception as exc:  # delivered to the caller, never kills the thread
                self.future.set_exception(exc)

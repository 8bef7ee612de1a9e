"""What a caller holds for queued engine work: a generation's event stream, or
one exclusive MLX job (both run on the engine thread, :mod:`.scheduler`), and
:func:`coalesced_wakeups`, which batches the event loop wake-ups of one engine step."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Generator, Iterator
from typing import Any

from mlxspec.engine.types import Cancelled, Event, Failed, Finished, GenerationRequest, JobAbandoned


class RequestHandle:
    """A submitted request: an async iterator of events, and ``cancel()``.

    Events are appended from the engine thread to a buffer; the loop is woken
    (``loop.call_soon_threadsafe``) only when the consumer is waiting on an
    empty buffer, so a consumer that falls behind drains several events per
    wake-up instead of costing the loop one callback per token. Inside
    :func:`coalesced_wakeups` the wake-up waits for the end of the block,
    where one callback wakes every handle of the loop that got events.
    Iteration ends after ``Finished``, ``Failed`` or ``Cancelled``.
    """

    def __init__(
        self, request: GenerationRequest, loop: asyncio.AbstractEventLoop, agreed: bool = False
    ) -> None:
        self.request = request
        self._loop = loop
        self._buffer: deque[Event] = deque()
        # Guards the hand-over between the engine thread's append and the
        # consumer's decision to sleep (no event may land unseen in between).
        self._lock = threading.Lock()
        self._waiter: asyncio.Future[None] | None = None
        self._cancelled = threading.Event()
        # The client's wish; with ``agreed`` the engine acts on it (``cancelled``)
        # only once every rank of a sharded server agreed (:meth:`agree_cancel`).
        self._wanted = threading.Event()
        self._agreed = agreed
        #: ``time.monotonic()`` at submission, for time-to-first-token.
        self.submitted_at = time.monotonic()
        #: ``time.monotonic()`` when the engine started the request (its
        #: prefill began), set on the engine thread; ``None`` while it waits.
        self.started_at: float | None = None

    @property
    def cancelled(self) -> bool:
        """True once the engine is to drop the request: :meth:`cancel` was called
        (on a sharded server, and every rank agreed: :meth:`agree_cancel`)."""
        return self._cancelled.is_set()

    @property
    def cancel_wanted(self) -> bool:
        """True once :meth:`cancel` was called, agreed or not."""
        return self._wanted.is_set()

    def cancel(self) -> None:
        """Stop this request: the engine drops it at its next decode step and
        iteration ends with ``Cancelled``. Safe from any thread, idempotent."""
        if not self._wanted.is_set():
            self._lost()
            self.emit(Cancelled())

    def agree_cancel(self) -> None:
        """Let the engine see the cancellation (the step plan of a sharded server
        carried it to every rank: :mod:`mlxspec.engine.distributed.lockstep`)."""
        self._wanted.set()
        self._cancelled.set()

    def _lost(self) -> None:
        """The client is gone: cancel at once, or at the next agreed step plan."""
        self._wanted.set()
        if not self._agreed:
            self._cancelled.set()

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to the request's consumer (any thread; the engine
        thread in practice)."""
        with self._lock:
            self._buffer.append(event)
            waiter, self._waiter = self._waiter, None
        if waiter is None:
            return
        deferred: list[tuple[RequestHandle, asyncio.Future[None]]] | None
        deferred = getattr(_step, "waiters", None)
        if deferred is not None:  # the engine step wakes them all at its end
            deferred.append((self, waiter))
            return
        try:
            self._loop.call_soon_threadsafe(_wake, waiter)
        except RuntimeError:  # the loop is closed: the client is gone
            self._lost()

    async def __aiter__(self) -> AsyncIterator[Event]:
        buffer = self._buffer
        while True:
            if not buffer:
                waiter = None
                with self._lock:
                    if not buffer:
                        self._waiter = waiter = self._loop.create_future()
                if waiter is not None:  # emit() takes it and wakes us
                    await waiter
                continue
            event = buffer.popleft()
            yield event
            if isinstance(event, (Finished, Failed, Cancelled)):
                return


def _wake(waiter: asyncio.Future[None]) -> None:
    """Resolve a consumer's wait future (on its loop), unless it was cancelled."""
    if not waiter.done():
        waiter.set_result(None)


def _wake_all(waiters: list[asyncio.Future[None]]) -> None:
    """Resolve several consumers' wait futures of one loop, in order."""
    for waiter in waiters:
        if not waiter.done():
            waiter.set_result(None)


#: Per thread: the waiters whose wake-up :func:`coalesced_wakeups` holds back.
_step = threading.local()


@contextlib.contextmanager
def coalesced_wakeups() -> Iterator[None]:
    """Hold back the event-loop wake-ups of :meth:`RequestHandle.emit` made by
    this thread inside the block, then make one per event loop.

    The engine thread wraps each batched decode step in it: a step emits a
    token to every row, and each ``call_soon_threadsafe`` writes the loop's
    self-pipe and runs one callback, so a batch of 8 rows cost 8 wake-ups
    per step; now it costs one, which resolves the waiters in emission order.
    Events themselves are buffered at once, as outside the block. Nested
    blocks fold into the outermost one. Only for blocks that end promptly
    (one step): a consumer sees nothing emitted inside until the block ends
    or :func:`flush_wakeups` is called.

    Yields:
        None.
    """
    if getattr(_step, "waiters", None) is not None:
        yield
        return
    _step.waiters = []
    try:
        yield
    finally:
        waiters, _step.waiters = _step.waiters, None
        _flush(waiters)


def flush_wakeups() -> None:
    """Make the wake-ups held back so far in this thread's
    :func:`coalesced_wakeups` block now (a no-op outside one).

    For slow work inside a step (keeping a finished row's KV cache, removing
    rows from the batch): the rows already served get their tokens before it,
    as they did when every emit woke the loop at once.
    """
    waiters = getattr(_step, "waiters", None)
    if waiters:
        _step.waiters = []
        _flush(waiters)


def _flush(deferred: list[tuple[RequestHandle, asyncio.Future[None]]]) -> None:
    """One ``call_soon_threadsafe`` per loop for the held-back wake-ups."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[RequestHandle, asyncio.Future]]] = {}
    for handle, waiter in deferred:
        by_loop.setdefault(handle._loop, []).append((handle, waiter))
    for loop, pairs in by_loop.items():
        try:
            loop.call_soon_threadsafe(_wake_all, [waiter for _, waiter in pairs])
        except RuntimeError:  # the loop is closed: its clients are gone
            for handle, _ in pairs:
                handle._lost()


class ExclusiveJob:
    """A callable queued to run on the engine thread between decode steps (see
    ``run_exclusive``).

    A plain job runs whole in :meth:`start`. A stepped one (``fn`` returns a
    generator) does one piece of work per :meth:`advance`, which the engine loop
    calls once per turn beside the running requests' decode steps, so long MLX
    work (a decision's prefill) does not hold every stream; the generator's
    return value is the result. ``left`` is set when the caller stopped waiting:
    a stepped job is then closed at its next step.
    """

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn = fn
        self.future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.left = threading.Event()
        self._steps: Any = None

    def start(self) -> bool:
        """Start the work; True once it is over (a plain job, a failure, a job
        whose caller left before it started), False while a stepped job has steps left."""
        # A caller that stopped waiting cancelled the future: skip the work.
        if not self.future.set_running_or_notify_cancel():
            return True
        try:
            result = self.fn()
        except Exception as exc:  # delivered to the caller, never kills the thread
            self.future.set_exception(exc)
            return True
        if not isinstance(result, Generator):
            self.future.set_result(result)
            return True
        self._steps = result
        return False

    def advance(self) -> bool:
        """One step of a started stepped job; True once it is over."""
        if self.left.is_set():  # nobody waits for the rest
            self._steps.close()
            self.future.set_exception(JobAbandoned())
            return True
        try:
            next(self._steps)
        except StopIteration as done:
            self.future.set_result(done.value)
            return True
        except Exception as exc:  # delivered to the caller, never kills the thread
            self.future.set_exception(exc)
            return True
        return False

    def abandon(self) -> None:
        """End the job unfinished (engine shutdown)."""
        if self._steps is not None:
            self._steps.close()
        if not self.future.done():
            self.future.set_exception(JobAbandoned())

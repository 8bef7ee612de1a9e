"""What the engine's job queue carries: one :data:`Job` type, a small tagged union.

The caller's side puts jobs on the queue (``Engine.submit``, ``run_exclusive``,
``close``); the engine thread takes them in order (:mod:`.scheduler`) and
tells them apart with ``match``:

* :class:`Generate`: a generation request with its token budget, whose KV
  cache projection (prompt plus budget) the :class:`~.kv_ledger.KvLedger` holds
  from submission to its end;
* :class:`Exclusive`: MLX work outside generation (:class:`~.handles.ExclusiveJob`);
* :class:`Stop`: shut the loop down.

The loop reads them through a :class:`JobSource`: :class:`LocalJobs` (the queue)
on one process, a broadcast step plan on a sharded server
(``mlxspec.engine.distributed``).
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from typing import Protocol

from mlxspec.engine.loop.handles import ExclusiveJob, RequestHandle


@dataclass(frozen=True)
class Generate:
    """A generation request to run.

    Args:
        handle (RequestHandle): the request and its event stream.
        budget (int): tokens it may generate (>= 1): its ``max_tokens`` capped
            by the room left in the context window or under the operator's cap
            (``Admission.room``), fixed at submission.
    """

    handle: RequestHandle
    budget: int

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV cache the request may reach: its prompt plus its budget."""
        return len(self.handle.request.prompt) + self.budget

    @property
    def cancelled(self) -> bool:
        """Whether its client cancelled it (``RequestHandle.cancelled``)."""
        return self.handle.cancelled


@dataclass(frozen=True)
class Exclusive:
    """MLX work to run on the engine thread between decode steps.

    Args:
        work (ExclusiveJob): the callable and the future its caller awaits.
    """

    work: ExclusiveJob


@dataclass(frozen=True)
class Stop:
    """End the engine loop; jobs queued after it are not run."""


#: One item of the engine's job queue.
Job = Generate | Exclusive | Stop


class JobSource(Protocol):
    """Where the engine loop takes its jobs: the seam of a sharded server.

    :class:`LocalJobs` reads the engine's queue; on a server sharded over
    several processes, ``mlxspec.engine.distributed``'s sources broadcast each
    turn's jobs from rank 0 so every rank's loop runs the same turns.
    """

    def turn(self, idle: bool) -> None:
        """Start a loop turn (the loop calls it once per turn, and once per
        token of a serial run); ``idle`` when nothing runs or waits."""

    def get(self, block: bool) -> Job | None:
        """The next job, waiting for one when ``block``; ``None`` when there is none."""

    def empty(self) -> bool:
        """Whether no job is ready."""

    def ended(self, handle: RequestHandle) -> None:
        """A request ended (counted out by the loop)."""

    def lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` ends the loop instead of failing one request."""


class LocalJobs:
    """The job source of a one-process server: the engine's queue as is.

    Args:
        jobs (queue.Queue[Job]): what ``Engine.submit``, ``run_exclusive`` and ``close`` queue.
    """

    def __init__(self, jobs: queue.Queue[Job]) -> None:
        self._queue = jobs

    def turn(self, idle: bool) -> None:
        """Nothing to agree on."""

    def get(self, block: bool) -> Job | None:
        """The next queued job (waiting for one when ``block``), or ``None``."""
        try:
            return self._queue.get(block=block)
        except queue.Empty:
            return None

    def empty(self) -> bool:
        """Whether the queue is empty now."""
        return self._queue.empty()

    def ended(self, handle: RequestHandle) -> None:
        """Nothing to forget."""

    def lost(self, exc: BaseException) -> bool:
        """Never: an error fails its request alone."""
        return False

"""Every rank runs the same loop turns: the step plan, broadcast from rank 0.

The engine loop (:class:`~mlxspec.engine.loop.scheduler.Scheduler`) takes its
jobs from a job source (:class:`~mlxspec.engine.loop.jobs.JobSource`), whose
:meth:`turn` it calls once per loop turn and once per token of a serial run.
On a sharded server that call is the one seam: rank 0's :class:`LeaderJobs`
takes what the HTTP side queued (new requests with their token ids, sampling
parameters and budget; the stop) and the cancellations its clients asked for,
and broadcasts them as one :class:`StepPlan`; every other rank's
:class:`FollowerJobs` receives it and feeds the same jobs to its own loop, so
the scheduler, the KV line, the prompt cache and the batch make the same
decisions everywhere and every model call (whose ``all_sum`` / send / recv join
the ranks) happens on all ranks at once. A cancellation reaches a loop only
through a plan (:meth:`~mlxspec.engine.loop.handles.RequestHandle.agree_cancel`),
so no rank drops a row the others still run.

The broadcast is ``mlx_lm.server``'s ``_share_object``: an ``all_sum`` of the
payload's length (rank 0 gives it, the others 0), then, when there is a payload,
an ``all_sum`` of its bytes. Every collective of the loop (the plan's and those
inside model calls) runs on mlx-lm's ``generation_stream``, so each rank runs
them in the same order. A turn where nothing changed costs one ``all_sum``
of one int32. A rank that waits inside a collective spins (the ring backend's
receive polls), so an idle group meets at agreed times instead: after each
empty plan of an idle loop every rank pauses :func:`idle_pause` seconds (10 ms,
doubling up to ``tick``) before the next broadcast. Rank 0 ends its pause early
when a request comes and waits in the collective for the others, so the first
request after a quiet spell starts up to ``tick`` late; an idle group wakes
``1 / tick`` times a second, which is also the heartbeat that lets a lost rank
be noticed while nothing runs (:mod:`.watchdog`).

The payload is a pickle: the ranks of one group trust each other (as
``mlx_lm.server``'s); nothing from a client is unpickled.
"""

from __future__ import annotations

import logging
import pickle
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxspec.engine.distributed.group import Topology
from mlxspec.engine.loop.handles import RequestHandle
from mlxspec.engine.loop.jobs import Exclusive, Generate, Job, Stop
from mlxspec.engine.types import Event, Failed, GenerationRequest, NotShardableError

log = logging.getLogger("mlxspec.engine.distributed")

#: The longest pause of an idle group between two broadcasts (the heartbeat), seconds.
DEFAULT_TICK_S = 0.25
#: The first pause after the loop went idle, seconds (doubled per empty plan).
FIRST_PAUSE_S = 0.01
#: Words of the backends' own "peer is gone" errors (``[ring] connection to a peer was lost``).
_BACKEND_TAGS = ("[ring]", "[mpi]", "[nccl]", "[jaccl]")


def idle_pause(quiet: int, tick: float) -> float:
    """Seconds every rank pauses before the next broadcast of an idle loop.

    Args:
        quiet (int): empty plans of an idle loop in a row (the same on every rank).
        tick (float): the longest pause, seconds.

    Returns:
        float: ``min(tick, FIRST_PAUSE_S * 2**quiet)``.
    """
    return min(tick, FIRST_PAUSE_S * 2 ** min(quiet, 30))


class GroupLost(RuntimeError):
    """A rank of the group is gone or unreachable: the group cannot go on."""


def is_group_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the group broke (:class:`GroupLost`, or a backend's
    own error from a collective inside a model call)."""
    if isinstance(exc, GroupLost):
        return True
    return isinstance(exc, RuntimeError) and str(exc).startswith(_BACKEND_TAGS)


@dataclass
class StepPlan:
    """What changed since the last turn, the same on every rank.

    Args:
        jobs (list[tuple[int, GenerationRequest, int]]): new requests in queue
            order: the plan's id, the request (token ids and sampling parameters),
            its token budget.
        cancels (list[int]): ids of running or waiting requests to drop.
        stop (bool): the loop ends after this turn's jobs.
    """

    jobs: list[tuple[int, GenerationRequest, int]] = field(default_factory=list)
    cancels: list[int] = field(default_factory=list)
    stop: bool = False

    def __bool__(self) -> bool:
        return bool(self.jobs or self.cancels or self.stop)

    def encode(self) -> bytes:
        """The plan's bytes (``b""`` for an empty plan)."""
        return pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL) if self else b""

    @staticmethod
    def decode(payload: bytes) -> StepPlan:
        """The plan ``payload`` holds (:meth:`encode`)."""
        return pickle.loads(payload) if payload else StepPlan()  # noqa: S301 - a peer rank's


class Broadcast:
    """Rank 0's bytes to every rank through two ``all_sum`` s (one when empty).

    Args:
        topology (Topology): the group.

    Attributes:
        collectives (int): collectives run so far (``/stats`` ``distributed``).
        turns (int): broadcasts so far.
        last_done (float): ``time.monotonic()`` when the last one returned.
        seconds (float): time spent in them.
    """

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.collectives = 0
        self.turns = 0
        self.seconds = 0.0
        self.last_done = time.monotonic()

    def share(self, payload: bytes | None) -> bytes:
        """Rank 0 passes its ``payload``, the others ``None``; all get rank 0's bytes.

        Raises:
            GroupLost: a collective failed (a peer is gone).
        """
        import mlx.core as mx
        import numpy as np
        from mlx_lm.generate import generation_stream

        # On the model's stream: a backend runs each stream's collectives in the order
        # queued, but two streams' in either order, which differs between ranks (a deadlock).
        group, stream, start = self.topology.group, generation_stream, time.perf_counter()
        try:
            head = mx.array([len(payload) if payload else 0], dtype=mx.int32)
            size = int(np.array(mx.distributed.all_sum(head, group=group, stream=stream))[0])
            self.collectives += 1
            out = b""
            if size:
                mine = (
                    np.frombuffer(payload, dtype=np.uint8)
                    if payload
                    else np.zeros(int(size), dtype=np.uint8)
                )
                summed = mx.distributed.all_sum(mx.array(mine), group=group, stream=stream)
                out = bytes(np.array(summed, copy=False))
                self.collectives += 1
        except RuntimeError as exc:
            raise GroupLost(str(exc)) from exc
        self.turns += 1
        self.seconds += time.perf_counter() - start
        self.last_done = time.monotonic()
        return out

    def snapshot(self) -> dict[str, Any]:
        """``plan_turns``, ``plan_collectives`` and ``plan_ms_mean`` (per turn)."""
        return {
            "plan_turns": self.turns,
            "plan_collectives": self.collectives,
            "plan_ms_mean": round(1000 * self.seconds / max(1, self.turns), 3),
        }


class _Jobs:
    """What both sides share: the turn's jobs in order and the requests in flight by id."""

    def __init__(
        self, broadcast: Broadcast, on_lost: Callable[[str], None], tick: float = DEFAULT_TICK_S
    ) -> None:
        self.broadcast, self._on_lost, self._tick = broadcast, on_lost, tick
        #: Set once a stop plan went out: the peers now exit on purpose.
        self.stopping = False
        #: Empty plans of an idle loop in a row (the same on every rank).
        self.quiet = 0
        self._ready: deque[Job] = deque()
        self._live: dict[int, RequestHandle] = {}
        self._ids: dict[int, int] = {}  # id(handle) -> plan id

    def get(self, block: bool) -> Job | None:
        """The next job of the turn (never waits: :meth:`turn` did)."""
        return self._ready.popleft() if self._ready else None

    def empty(self) -> bool:
        """Whether the turn's jobs are all taken."""
        return not self._ready

    def ended(self, handle: RequestHandle) -> None:
        """Forget a request that ended (every rank at the same turn)."""
        rid = self._ids.pop(id(handle), None)
        if rid is not None:
            self._live.pop(rid, None)

    def lost(self, exc: BaseException) -> bool:
        """Whether ``exc`` means the group broke; if so the held requests are
        answered (``on_lost``) before the loop stops and cancels what is left."""
        if not is_group_error(exc):
            return False
        self._on_lost(str(exc))
        return True

    def _share(self, payload: bytes | None) -> bytes:
        try:
            return self.broadcast.share(payload)
        except GroupLost as exc:
            self._on_lost(str(exc))
            raise

    def pause(self, idle: bool) -> float:
        """This turn's agreed pause, seconds (0 unless ``idle``: :func:`idle_pause`)."""
        return idle_pause(self.quiet, self._tick) if idle else 0.0

    def _apply(self, plan: StepPlan, jobs: list[Generate], idle: bool) -> None:
        self.quiet = self.quiet + 1 if idle and not plan else 0
        for (rid, _, _), job in zip(plan.jobs, jobs, strict=True):
            self._live[rid] = job.handle
            self._ids[id(job.handle)] = rid
            self._ready.append(job)
        for rid in plan.cancels:
            if (handle := self._live.get(rid)) is not None:
                handle.agree_cancel()
        if plan.stop:
            self.stopping = True
            self._ready.append(Stop())


class LeaderJobs(_Jobs):
    """Rank 0's job source: the engine's queue, broadcast as a plan each turn.

    Args:
        jobs (queue.Queue[Job]): what ``Engine.submit`` and ``close`` queue.
        broadcast (Broadcast): the group's broadcast.
        on_lost (Callable[[str], None]): called with the reason when the group
            breaks (:meth:`~.serving.ShardedServing.lose`).
        tick (float): seconds an idle turn waits for work before it sends an
            empty plan (the heartbeat). Default: :data:`DEFAULT_TICK_S`.
    """

    def __init__(
        self,
        jobs: queue.Queue[Job],
        broadcast: Broadcast,
        on_lost: Callable[[str], None],
        tick: float = DEFAULT_TICK_S,
    ) -> None:
        super().__init__(broadcast, on_lost, tick)
        self._queue = jobs
        self._next_id = 0
        self._failing = threading.Lock()

    def turn(self, idle: bool) -> None:
        """Take the queued jobs (waiting up to the agreed pause when ``idle``:
        :func:`idle_pause`) and the wanted cancellations, broadcast them, and
        ready them for the loop.

        Raises:
            GroupLost: the broadcast failed.
        """
        taken: list[Job] = []
        try:
            pause = self.pause(idle)
            taken.append(self._queue.get(timeout=pause) if idle else self._queue.get_nowait())
            while True:
                taken.append(self._queue.get_nowait())
        except queue.Empty:
            pass
        plan, jobs = StepPlan(), []
        for job in taken:
            match job:
                case Generate(handle=handle, budget=budget):
                    plan.jobs.append((self._next_id, handle.request, budget))
                    jobs.append(job)
                    self._next_id += 1
                case Exclusive(work=work):  # refused before queueing; never run on one rank only
                    work.future.set_exception(NotShardableError("not on a sharded server"))
                case Stop():
                    plan.stop = True
        plan.cancels = [rid for rid, h in self._live.items() if h.cancel_wanted and not h.cancelled]
        self.stopping = self.stopping or plan.stop  # before the peers can act on it
        self._share(plan.encode())
        self._apply(plan, jobs, idle)

    def fail_all(self, message: str) -> int:
        """Answer every request in flight or queued with a 503 ``Failed`` (any
        thread: the watchdog's, or the engine's after :class:`GroupLost`);
        returns how many. Idempotent."""
        with self._failing:
            handles = list(self._live.values())
            self._live.clear()
            try:
                while True:
                    job = self._queue.get_nowait()
                    if isinstance(job, Generate):
                        handles.append(job.handle)
                    elif isinstance(job, Exclusive):
                        job.work.abandon()
            except queue.Empty:
                pass
        for handle in handles:
            handle.emit(Failed(message, error="group_unavailable"))
        return len(handles)


class _Shadow(RequestHandle):
    """A follower's copy of a request: its events go nowhere (rank 0 answers)."""

    def __init__(self, request: GenerationRequest) -> None:
        super().__init__(request, None, agreed=True)  # type: ignore[arg-type]

    def emit(self, event: Event) -> None:
        """Dropped: only rank 0 has a client."""


class FollowerJobs(_Jobs):
    """A follower rank's job source: rank 0's plans.

    Args:
        broadcast (Broadcast): the group's broadcast.
        on_lost (Callable[[str], None]): called with the reason when the group breaks.
        on_job (Callable[[Generate], None]): called with each new request before
            the loop sees it (the engine's KV ledger, as ``Engine.submit`` does).
        tick (float): rank 0's ``tick`` (the longest idle pause). Default:
            :data:`DEFAULT_TICK_S`.
    """

    def __init__(
        self,
        broadcast: Broadcast,
        on_lost: Callable[[str], None],
        on_job: Callable[[Generate], None],
        tick: float = DEFAULT_TICK_S,
    ) -> None:
        super().__init__(broadcast, on_lost, tick)
        self._on_job = on_job

    def turn(self, idle: bool) -> None:
        """Receive this turn's plan and ready its jobs; when ``idle``, sleep the
        agreed pause first (:func:`idle_pause`), so the wait for rank 0 inside
        the collective, which spins, stays short.

        Raises:
            GroupLost: the broadcast failed (rank 0 or a peer is gone).
        """
        if idle:
            time.sleep(self.pause(True))
        plan = StepPlan.decode(self._share(None))
        jobs = []
        for _, request, budget in plan.jobs:
            job = Generate(_Shadow(request), budget)
            self._on_job(job)
            jobs.append(job)
        self._apply(plan, jobs, idle)

"""The engine thread's loop: which request runs where, one step at a time.

Jobs arrive on the engine's queue. Exclusive jobs (embeddings) run whole
between steps, or, when stepped (decision scoring), a prefill chunk per loop
turn beside the decode steps (:class:`~.handles.ExclusiveJob`); requests go into the KV line
(:class:`~.admission.KvGate`) and start from its head while they fit. A
started request runs in one of three places: alone to its end on mlx-lm's
``generate_step`` (``--batch 1``, or a seeded request using XTC, whose coin
comes from MLX's global random stream), alone a token per
loop turn on ``generate_step`` while nothing else runs (:mod:`.solo`), or in
the continuous batch (:class:`~.batching.BatchLane`), which the lone request
joins when a second one arrives. The loop never lets an exception in one
request end the thread: the request fails alone (a broken batch fails its rows
and a fresh batch takes over).
"""

from __future__ import annotations

import functools
import logging
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from mlxspec.engine.loop.batching import BatchLane
from mlxspec.engine.loop.handles import ExclusiveJob, RequestHandle, coalesced_wakeups
from mlxspec.engine.loop.solo import SoloRun, run_alone
from mlxspec.engine.sampling.sampler import needs_global_seed
from mlxspec.engine.types import Failed

if TYPE_CHECKING:
    from mlxspec.engine.engine import Engine

log = logging.getLogger("mlxspec.engine")
T = TypeVar("T")

#: What :meth:`Scheduler.admit` reads when the job queue is empty (``None``
#: means shut down).
_NO_JOB = object()


class Scheduler:
    """The engine thread's state and loop (nothing here runs on another thread).

    Args:
        engine (Engine): the engine whose jobs, admission, counters and lane
            parts this loop uses; its ``running_kv_tokens``, ``counters`` and
            ``handoffs`` are kept here.
        jobs (queue.Queue): the engine's job queue (``None`` ends the loop).
    """

    def __init__(self, engine: Engine, jobs: queue.Queue[Any]) -> None:
        self.engine, self.jobs = engine, jobs
        self.admission = engine.admission
        self.lane = self._new_lane() if engine.max_batch > 1 else None
        #: The lone request decoding on ``generate_step`` in the batched lane.
        self.solo: SoloRun | None = None
        self.solo_tokens = 0  # its projection, while it decodes alone
        #: Exclusive jobs in order: the head advances a step per loop turn.
        self.exclusive: deque[ExclusiveJob] = deque()
        #: Jobs taken off the queue during a serial run that :meth:`admit`
        #: handles first, in order: from the first exclusive job or shutdown
        #: sentinel on (requests as ``(handle, KV projection)``).
        self.backlog: deque[Any] = deque()

    def run(self) -> None:
        """Take jobs and step the lone request or the batch until shut down."""
        try:
            while self.admit():
                if self.exclusive:
                    self.step_exclusive()
                if self.solo is not None:
                    self.step_solo()
                elif self.lane is not None and len(self.lane):
                    try:
                        with coalesced_wakeups():  # one loop wake-up per step, not per row
                            self.lane.step()
                    except Exception:  # a broken batch fails its rows, not the engine
                        log.exception("batch step failed")
                        self.engine.counters["failed"] += self.lane.fail_all("generation failed")
                        self.lane.close()
                        self.lane = self._new_lane()
        finally:
            for job in (*self.exclusive, *self.backlog):
                if isinstance(job, ExclusiveJob):
                    job.abandon()
            if self.solo is not None:
                self.solo.cancel()
            if self.lane is not None:
                self.lane.close()
            while (waiting := self.admission.kv_gate.pop_ready(0)) is not None:
                waiting[0].cancel()
            for job in self.backlog:
                if isinstance(job, tuple):
                    job[0].cancel()

    def admit(self) -> bool:
        """Take queued jobs (waiting only when idle) into line, then start the
        requests the KV budget lets in; False on shutdown."""
        self.admission.running_tokens = self.running_tokens()  # rows may have ended
        lane, gate = self.lane, self.admission.kv_gate
        idle = self.solo is None and (lane is None or not len(lane)) and not gate
        idle = idle and not self.exclusive and not self.backlog
        job = self.next_job(block=idle)
        while job is not None and job is not _NO_JOB:
            if isinstance(job, ExclusiveJob):
                self.start_waiting()  # what was queued before it starts first
                self.exclusive.append(job)
                if len(self.exclusive) == 1:
                    self.start_exclusive()
            elif isinstance(job, tuple):  # a request the serial lane set aside
                gate.push(*job)
            else:
                gate.push(job, self.admission.incoming.popleft())
            job = self.next_job(block=False)
        if job is None:
            return False
        self.start_waiting()
        return True

    def next_job(self, block: bool) -> Any:
        """The next job: from :attr:`backlog` first, then the queue (waiting for
        one when ``block``); :data:`_NO_JOB` when there is none."""
        if self.backlog:
            return self.backlog.popleft()
        try:
            return self.jobs.get(block=block)
        except queue.Empty:
            return _NO_JOB

    def start_exclusive(self) -> None:
        """Start exclusive jobs from the head of the line; plain ones run whole,
        and the first stepped one stays at the head to advance a step per turn."""
        while self.exclusive and self.exclusive[0].start():
            self.exclusive.popleft()

    def step_exclusive(self) -> None:
        """Advance the stepped job at the head by one step (a prefill chunk)."""
        if self.exclusive[0].advance():
            self.exclusive.popleft()
            self.start_exclusive()

    def start_waiting(self) -> None:
        """Start requests from the head of the KV line while they fit."""
        gate = self.admission.kv_gate
        for _ in range(gate.drop_cancelled()):
            self.count("cancelled")
        while (ready := gate.pop_ready(self.running_tokens())) is not None:
            self.start(*ready)
        self.admission.running_tokens = self.running_tokens()

    def running_tokens(self) -> int:
        """Tokens of KV cache the lone request and the batch project together."""
        return self.solo_tokens + (self.lane.projected_tokens if self.lane is not None else 0)

    def start(self, handle: RequestHandle, tokens: int) -> None:
        """Run ``handle`` (projecting ``tokens``) in its lane: serial, alone on
        ``generate_step``, or batched."""
        lane = self.lane
        if handle.cancelled:
            self.count("cancelled")
            return
        if lane is None or needs_global_seed(handle.request.sampling):
            handle.started_at = time.monotonic()  # its prefill begins (queue time ends)
            self.admission.running_tokens = self.running_tokens() + tokens  # while it runs
            self.serial(handle)
        elif self.goes_solo(lane, handle):
            handle.started_at = time.monotonic()
            parts, times = self.engine.lane_parts, self.engine.solo_times
            solo = functools.partial(SoloRun, handle, parts, self.budget(handle), "batched", times)
            self.solo = self.guard(handle, solo)
            self.solo_tokens = tokens if self.solo is not None else 0
        else:  # the batch marks it started when its prefill begins (it may wait for a row)
            self.hand_over(lane)
            self.guard(handle, lambda: lane.add(handle, self.budget(handle)))

    def goes_solo(self, lane: BatchLane, handle: RequestHandle) -> bool:
        """A lone request decodes on ``generate_step`` (:mod:`.solo`): nothing
        is batched, running alone or queued behind it, and no ``n`` siblings follow."""
        return (
            not len(lane)
            and self.solo is None
            and self.jobs.empty()
            and not self.backlog
            and not self.admission.kv_gate
            and not handle.request.shared_prefill
        )

    def step_solo(self) -> None:
        """Advance the lone request by one prefill chunk or token."""
        solo = self.solo
        assert solo is not None
        ended = self.guard(solo.handle, solo.step)
        if ended is not False:  # True, or None when it failed
            self.solo, self.solo_tokens = None, 0
            if ended:
                self.count(solo.outcome)

    def hand_over(self, lane: BatchLane) -> None:
        """Move the lone request into the batch before another joins."""
        solo, self.solo, self.solo_tokens = self.solo, None, 0
        if solo is None:
            return
        handoff = self.guard(solo.handle, solo.handoff, fallback=False)
        if handoff is None:  # it ended on its sampled-ahead token, or was cancelled
            self.count(solo.outcome)
        elif handoff is not False:
            self.engine.handoffs += 1
            self.guard(solo.handle, lambda: lane.adopt(handoff))

    def guard(self, handle: RequestHandle, fn: Callable[[], T], fallback: Any = None) -> Any:
        """``fn()``, or ``fallback`` after failing ``handle`` alone when it raises
        (an exception here used to end the engine thread, hanging every request)."""
        try:
            return fn()
        except Exception:
            log.exception("generation failed")
            handle.emit(Failed("generation failed"))
            self.count("failed")
            return fallback

    def count(self, outcome: str) -> None:
        """Count a request that ended: ``completed``, ``cancelled`` or ``failed``."""
        self.engine.counters[outcome] += 1

    def budget(self, handle: RequestHandle) -> int:
        """Tokens the request may generate (:meth:`Engine.budget`)."""
        return self.engine.budget(handle.request)

    def serial(self, handle: RequestHandle) -> None:
        """Run ``handle`` alone to its end (the batch and any lone request wait;
        requests cancelled while they wait are counted out between its tokens)."""
        engine = self.engine
        run = functools.partial(
            run_alone,
            handle,
            engine.lane_parts,
            self.budget(handle),
            engine.solo_times,
            self.drop_cancelled_waiting,
        )
        outcome = self.guard(handle, run)
        if outcome is not None:
            self.count(outcome)

    def drop_cancelled_waiting(self) -> None:
        """Take queued requests into line without starting any, and count out
        the ones that were cancelled, so their queue places free up while a
        serial request runs (it holds the loop for its whole length).

        Once an exclusive job or the shutdown sentinel is met, it and every job
        after it go to :attr:`backlog` in order (requests with their KV
        projection), for :meth:`admit` to handle as it would have; cancelled
        requests there are counted out too.
        """
        gate, incoming = self.admission.kv_gate, self.admission.incoming
        while True:
            try:
                job = self.jobs.get_nowait()
            except queue.Empty:
                break
            if job is None or isinstance(job, ExclusiveJob):
                self.backlog.append(job)
            elif self.backlog:
                self.backlog.append((job, incoming.popleft()))
            else:
                gate.push(job, incoming.popleft())
        if self.backlog:
            kept = deque(j for j in self.backlog if not (isinstance(j, tuple) and j[0].cancelled))
            for _ in range(len(self.backlog) - len(kept)):
                self.count("cancelled")
            self.backlog = kept
        for _ in range(gate.drop_cancelled()):
            self.count("cancelled")

    def _new_lane(self) -> BatchLane:
        engine = self.engine
        return BatchLane(engine.lane_parts, engine.max_batch, self.count, engine.step_times)

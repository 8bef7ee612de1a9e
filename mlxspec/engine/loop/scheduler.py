"""The engine thread's loop: which request runs where, one step at a time.

Jobs arrive on the engine's queue, one typed :data:`~.jobs.Job` each. Exclusive
jobs (embeddings) run whole between steps, or, when stepped (decision scoring),
a prefill chunk per loop turn beside the decode steps
(:class:`~.handles.ExclusiveJob`); requests go into the KV line
(:class:`~.kv_ledger.KvLedger`) and start from its head while they fit. A
started request runs in one of three places: alone to its end on mlx-lm's
``generate_step`` (``--batch 1``, or a seeded request using XTC, whose coin
comes from MLX's global random stream), alone a token per loop turn on
``generate_step`` while nothing else runs (:mod:`.solo`), or in the continuous
batch (:class:`~.batching.BatchLane`), which the lone request joins when a
second one arrives. Under a draft source a request that may speculate always
runs in the batch (even at ``--batch 1``), where drafts are verified; so does a
request with media, whose prompt the vision wing prefills a step at a time
first (:mod:`.media_prefill`). Every request ends in :meth:`Scheduler.end`,
which counts its outcome and releases its KV projection. The loop never lets an
exception in one request end the thread: the request fails alone (a broken
batch fails its rows and a fresh batch takes over), unless the job source says
the process group of a sharded server broke (:meth:`~.jobs.JobSource.lost`).
The loop takes its jobs from a :class:`~.jobs.JobSource`, whose ``turn`` starts
every loop turn: the queue on one process, rank 0's broadcast step plan on a
sharded server (``mlxspec.engine.distributed``), so every rank runs the same
turns.
"""

from __future__ import annotations

import functools
import logging
import queue
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from mlxspec.engine.loop.batching import BatchLane
from mlxspec.engine.loop.handles import ExclusiveJob, RequestHandle, coalesced_wakeups
from mlxspec.engine.loop.jobs import Exclusive, Generate, Job, JobSource, LocalJobs, Stop
from mlxspec.engine.loop.kv_ledger import KvLedger
from mlxspec.engine.loop.lanes import LaneParts, LoopStats
from mlxspec.engine.loop.solo import SoloRun, run_alone
from mlxspec.engine.sampling.sampler import needs_global_seed
from mlxspec.engine.types import EngineRequestError, Failed

log = logging.getLogger("mlxspec.engine")
T = TypeVar("T")


class Scheduler:
    """The engine thread's state and loop (nothing here runs on another thread).

    Args:
        jobs (queue.Queue[Job] | JobSource): the engine's job queue, or a source
            of jobs (a sharded server's broadcast step plan); :class:`~.jobs.Stop`
            ends the loop.
        parts (LaneParts): what the lanes run requests with.
        kv (KvLedger): the requests' KV projections: the line they wait in and
            what the running ones hold.
        stats (LoopStats): where outcomes, handoffs and step times are counted.
        max_batch (int): most requests decoding at once; ``1`` runs each alone
            to its end (the serial lane).
    """

    def __init__(
        self,
        jobs: queue.Queue[Job] | JobSource,
        parts: LaneParts,
        kv: KvLedger,
        stats: LoopStats,
        max_batch: int,
    ) -> None:
        self.jobs: JobSource = LocalJobs(jobs) if isinstance(jobs, queue.Queue) else jobs
        self.parts, self.kv, self.stats = parts, kv, stats
        self.max_batch = max_batch
        # drafts are verified, and media prefilled, in the batched lane: there even at --batch 1
        batched = max_batch > 1 or parts.speculator is not None or parts.vision is not None
        self.lane = self._new_lane() if batched else None
        #: The lone request decoding on ``generate_step`` in the batched lane.
        self.solo: SoloRun | None = None
        #: Exclusive jobs in order: the head advances a step per loop turn.
        self.exclusive: deque[ExclusiveJob] = deque()
        #: Jobs taken off the queue during a serial run that :meth:`admit`
        #: handles first, in order: from the first exclusive job or stop on.
        self.backlog: deque[Job] = deque()

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
                    except Exception as exc:  # a broken batch fails its rows, not the engine
                        if self.jobs.lost(exc):  # ...unless the process group broke
                            raise
                        log.exception("batch step failed")
                        self.lane.fail_all("generation failed")
                        self.lane.close()
                        self.lane = self._new_lane()
        finally:
            self.shut_down()

    def shut_down(self) -> None:
        """Abandon the exclusive jobs and cancel every request still held."""
        for work in self.exclusive:
            work.abandon()
        for job in self.backlog:
            match job:
                case Exclusive(work=work):
                    work.abandon()
                case Generate(handle=handle):
                    handle.cancel()
        if self.solo is not None:
            self.solo.cancel()
        if self.lane is not None:
            self.lane.close()
        for waiting in self.kv.drain():
            waiting.handle.cancel()

    def admit(self) -> bool:
        """Take queued jobs (waiting only when idle) into line, then start the
        requests the KV budget lets in; False on shutdown."""
        lane = self.lane
        idle = self.solo is None and (lane is None or not len(lane)) and not self.kv.line
        idle = idle and not self.exclusive and not self.backlog
        self.jobs.turn(idle)
        job = self.next_job(block=idle)
        while job is not None:
            match job:
                case Stop():
                    return False
                case Exclusive(work=work):
                    self.start_waiting()  # what was queued before it starts first
                    self.exclusive.append(work)
                    if len(self.exclusive) == 1:
                        self.start_exclusive()
                case Generate():
                    self.kv.line_up(job)
            job = self.next_job(block=False)
        self.start_waiting()
        return True

    def next_job(self, block: bool) -> Job | None:
        """The next job: from :attr:`backlog` first, then the queue (waiting for
        one when ``block``); ``None`` when there is none."""
        if self.backlog:
            return self.backlog.popleft()
        return self.jobs.get(block=block)

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
        self.stats.outcomes["cancelled"] += self.kv.drop_cancelled()  # they never started
        while (job := self.kv.start_next()) is not None:
            self.start(job)

    def start(self, job: Generate) -> None:
        """Run a request the KV line let in: serial, alone on
        ``generate_step``, or batched."""
        handle, lane = job.handle, self.lane
        if handle.cancelled:
            self.end(handle, "cancelled")
            return
        # drafts are verified, and media prefilled on the vision wing, in the batch only
        batch_only = self.parts.speculates(handle) or handle.request.media is not None
        if lane is None or (not batch_only and (self.max_batch == 1 or self.seeded(handle))):
            handle.started_at = time.monotonic()  # its prefill begins (queue time ends)
            self.serial(job)
        elif not batch_only and self.goes_solo(lane, handle):
            handle.started_at = time.monotonic()
            times = self.stats.solo_steps
            solo = functools.partial(SoloRun, handle, self.parts, job.budget, "batched", times)
            self.solo = self.guard(handle, solo)
        else:  # the batch marks it started when its prefill begins (it may wait for a row)
            self.hand_over(lane)
            self.guard(handle, lambda: lane.add(handle, job.budget))

    @staticmethod
    def seeded(handle: RequestHandle) -> bool:
        """Its sampler draws from MLX's global random stream (:func:`needs_global_seed`)."""
        return needs_global_seed(handle.request.sampling)

    def goes_solo(self, lane: BatchLane, handle: RequestHandle) -> bool:
        """A lone request decodes on ``generate_step`` (:mod:`.solo`): nothing
        is batched, running alone or queued behind it, and no ``n`` siblings follow."""
        return (
            not len(lane)
            and self.solo is None
            and self.jobs.empty()
            and not self.backlog
            and not self.kv.line
            and not handle.request.shared_prefill
        )

    def step_solo(self) -> None:
        """Advance the lone request by one prefill chunk or token."""
        solo = self.solo
        assert solo is not None
        ended = self.guard(solo.handle, solo.step)
        if ended is not False:  # True, or None when it failed
            self.solo = None
            if ended:
                self.end(solo.handle, solo.outcome)

    def hand_over(self, lane: BatchLane) -> None:
        """Move the lone request into the batch before another joins (its KV
        projection stays held: the batch ends it)."""
        solo, self.solo = self.solo, None
        if solo is None:
            return
        handoff = self.guard(solo.handle, solo.handoff, fallback=False)
        if handoff is None:  # it ended on its sampled-ahead token, or was cancelled
            self.end(solo.handle, solo.outcome)
        elif handoff is not False:
            self.stats.handoffs += 1
            self.guard(solo.handle, lambda: lane.adopt(handoff))

    def guard(self, handle: RequestHandle, fn: Callable[[], T], fallback: Any = None) -> Any:
        """``fn()``, or ``fallback`` after failing ``handle`` alone when it raises
        (an exception here used to end the engine thread, hanging every request)."""
        try:
            return fn()
        except Exception as exc:
            if self.jobs.lost(exc):  # the process group broke: the loop ends
                raise
            return self._failed(handle, exc, fallback)

    def _failed(self, handle: RequestHandle, exc: Exception, fallback: Any) -> Any:
        """Fail ``handle`` alone for ``exc``; returns ``fallback``."""
        if isinstance(exc, EngineRequestError):  # the request, not the engine (an adapter gone)
            handle.emit(Failed(exc.message))
        else:
            log.error("generation failed", exc_info=exc)
            handle.emit(Failed("generation failed"))
        self.end(handle, "failed")
        return fallback

    def end(self, handle: RequestHandle, outcome: str) -> None:
        """A request ended: count its outcome (``completed``, ``cancelled`` or
        ``failed``) and release its KV projection and adapter lease."""
        self.kv.release(handle)
        self.parts.release(handle)
        self.jobs.ended(handle)
        self.stats.outcomes[outcome] += 1

    def serial(self, job: Generate) -> None:
        """Run a request alone to its end (the batch and any lone request wait;
        requests cancelled while they wait are counted out between its tokens)."""
        run = functools.partial(
            run_alone,
            job.handle,
            self.parts,
            job.budget,
            self.stats.solo_steps,
            self.drop_cancelled_waiting,
        )
        outcome = self.guard(job.handle, run)
        if outcome is not None:
            self.end(job.handle, outcome)

    def drop_cancelled_waiting(self) -> None:
        """Take queued requests into line without starting any, and count out
        the ones that were cancelled, so their queue places free up while a
        serial request runs (it holds the loop for its whole length).

        Once an exclusive job or the stop is met, it and every job after it go
        to :attr:`backlog` in order, for :meth:`admit` to handle as it would
        have; cancelled requests there are counted out too.
        """
        self.jobs.turn(False)
        while (job := self.jobs.get(block=False)) is not None:
            match job:
                case Generate() if not self.backlog:
                    self.kv.line_up(job)
                case _:
                    self.backlog.append(job)
        kept: deque[Job] = deque()
        for job in self.backlog:
            if isinstance(job, Generate) and job.cancelled:
                self.end(job.handle, "cancelled")
            else:
                kept.append(job)
        self.backlog = kept
        self.stats.outcomes["cancelled"] += self.kv.drop_cancelled()

    def _new_lane(self) -> BatchLane:
        return BatchLane(self.parts, self.max_batch, self.end, self.stats.steps)

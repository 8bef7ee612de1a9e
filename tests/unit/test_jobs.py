"""The engine's job queue and KV ledger, without a model: the typed jobs
(:mod:`mlxspec.engine.loop.jobs`), every request's KV projection from
submission to its end (:class:`~mlxspec.engine.loop.kv_ledger.KvLedger`), and
the scheduler taking jobs off a queue in order."""

from __future__ import annotations

import asyncio
import dataclasses
import queue
import threading
from collections.abc import Iterator

import pytest

from mlxspec.engine import Cancelled, GenerationRequest, RequestHandle
from mlxspec.engine.caches.prompt_cache import CacheNamespace, PromptCache
from mlxspec.engine.loop.handles import ExclusiveJob
from mlxspec.engine.loop.jobs import Exclusive, Generate, Job, Stop
from mlxspec.engine.loop.kv_ledger import KvLedger
from mlxspec.engine.loop.lanes import LaneParts, LoopStats
from mlxspec.engine.loop.scheduler import Scheduler


@pytest.fixture()
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop for request handles (events are buffered, never awaited)."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def generate(loop: asyncio.AbstractEventLoop, prompt: int, budget: int) -> Generate:
    """A request with a ``prompt``-token prompt that may generate ``budget`` tokens."""
    request = GenerationRequest(tuple(range(1, prompt + 1)), max_tokens=budget)
    return Generate(RequestHandle(request, loop), budget)


def describe(job: Job) -> str:
    """What the scheduler does with each kind of job (the ``match`` it runs)."""
    match job:
        case Generate(handle=handle, budget=budget):
            return f"generate {len(handle.request.prompt)}+{budget}"
        case Exclusive():
            return "exclusive"
        case Stop():
            return "stop"


# ------------------------------------------------------------------ jobs


def test_a_generate_job_projects_its_prompt_plus_its_budget(loop) -> None:
    job = generate(loop, prompt=12, budget=30)
    assert job.kv_tokens == 42
    assert not job.cancelled
    job.handle.cancel()
    assert job.cancelled


def test_jobs_are_frozen_and_told_apart_by_kind(loop) -> None:
    jobs: list[Job] = [generate(loop, 3, 5), Exclusive(ExclusiveJob(lambda: 1)), Stop()]
    assert [describe(job) for job in jobs] == ["generate 3+5", "exclusive", "stop"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        jobs[0].budget = 6  # type: ignore[misc, union-attr]
    assert Stop() == Stop()


# ------------------------------------------------------------------ ledger


def test_a_request_is_held_from_submission_to_release(loop) -> None:
    kv = KvLedger(room=None)
    job = generate(loop, 8, 32)
    kv.submit(job)
    assert (kv.incoming, len(kv.line), kv.running_tokens) == ([40], 0, 0)
    kv.line_up(job)
    assert (kv.incoming, len(kv.line), kv.running_tokens) == ([], 1, 0)
    assert kv.start_next() is job
    assert (kv.incoming, len(kv.line), kv.running_tokens) == ([], 0, 40)
    assert kv.start_next() is None  # nothing left in line
    kv.release(job.handle)
    assert kv.running_tokens == 0
    kv.release(job.handle)  # twice, or a request it never held: nothing changes
    kv.release(generate(loop, 1, 1).handle)
    assert kv.running_tokens == 0


def test_the_line_starts_its_head_while_it_fits_and_nobody_overtakes(loop) -> None:
    kv = KvLedger(room=100)
    a, b, c = generate(loop, 10, 50), generate(loop, 10, 40), generate(loop, 5, 5)  # 60, 50, 10
    for job in (a, b, c):
        kv.submit(job)
        kv.line_up(job)
    assert kv.start_next() is a
    assert kv.start_next() is None  # b would make 110; c (10) fits but waits behind b
    assert kv.running_tokens == 60
    kv.release(a.handle)
    assert (kv.start_next(), kv.start_next()) == (b, c)  # 50 + 10 within 100
    assert kv.running_tokens == 60


def test_a_request_larger_than_the_room_runs_alone(loop) -> None:
    kv = KvLedger(room=10)
    small, big = generate(loop, 2, 3), generate(loop, 100, 400)
    for job in (small, big):
        kv.submit(job)
        kv.line_up(job)
    assert kv.start_next() is small
    assert kv.start_next() is None
    kv.release(small.handle)
    assert kv.start_next() is big
    assert kv.running_tokens == 500


def test_the_prediction_packs_the_line_then_the_queue_on_the_running(loop) -> None:
    kv = KvLedger(room=50)
    running, in_line, queued = generate(loop, 10, 20), generate(loop, 10, 20), generate(loop, 5, 5)
    for job in (running, in_line, queued):
        kv.submit(job)
    kv.line_up(running)
    kv.start_next()  # 30 running
    kv.line_up(in_line)  # 30 more does not fit: it waits, and so does all behind it
    assert kv.waiting_after(1) == 3  # in_line, queued and the new one
    kv.release(running.handle)
    assert kv.waiting_after(10) == 0  # 30 + 10 + 10 <= 50
    assert kv.waiting_after(11, count=2) == 2  # 30 + 10 + 11 > 50: both new ones wait
    assert KvLedger(room=None).waiting_after(10**9, count=5) == 0


def test_a_request_released_before_it_is_lined_up_leaves_the_prediction(loop) -> None:
    """A request cancelled while the serial lane holds the loop ends from the
    backlog, before it is ever lined up."""
    kv = KvLedger(room=50)
    first, cancelled = generate(loop, 10, 30), generate(loop, 10, 30)
    kv.submit(first)
    kv.submit(cancelled)
    assert kv.incoming == [40, 40]
    assert kv.waiting_after(10) == 2
    kv.release(cancelled.handle)
    assert kv.incoming == [40]
    assert kv.waiting_after(10) == 0


def test_cancelled_requests_leave_the_line_and_shutdown_drains_it(loop) -> None:
    kv = KvLedger(room=None)
    jobs = [generate(loop, 4, 4) for _ in range(4)]
    for job in jobs:
        kv.submit(job)
        kv.line_up(job)
    jobs[1].handle.cancel()
    jobs[3].handle.cancel()
    assert kv.drop_cancelled() == 2
    assert kv.drain() == [jobs[0], jobs[2]]
    assert (len(kv.line), kv.running_tokens) == (0, 0)


def test_submitting_threads_and_the_engine_thread_keep_the_totals(loop) -> None:
    """Submissions from several threads while another starts and releases
    requests: every projection is counted once and released once."""
    kv = KvLedger(room=1000)
    jobs = [generate(loop, 3, 7) for _ in range(400)]
    handed: queue.Queue[Generate] = queue.Queue()

    def submit(part: list[Generate]) -> None:
        for job in part:
            kv.submit(job)
            handed.put(job)

    threads = [threading.Thread(target=submit, args=(jobs[i::4],)) for i in range(4)]
    for thread in threads:
        thread.start()
    started = 0
    while started < len(jobs):
        kv.line_up(handed.get(timeout=10))
        while (job := kv.start_next()) is not None:
            assert kv.running_tokens <= 1000
            kv.release(job.handle)
            started += 1
    for thread in threads:
        thread.join()
    assert (kv.incoming, len(kv.line), kv.running_tokens) == ([], 0, 0)


# ------------------------------------------------------------------ scheduler


def _parts() -> LaneParts:
    """Lane parts that no lane reads: the serial lane runs nothing here."""
    return LaneParts(None, None, frozenset(), (), 8, PromptCache(0), CacheNamespace("none"))


def test_the_scheduler_takes_jobs_in_order_until_it_stops(loop) -> None:
    """Exclusive jobs run in order, a request cancelled before it starts ends
    counted and released, and jobs after the stop are never taken."""
    jobs: queue.Queue[Job] = queue.Queue()
    kv, stats = KvLedger(room=None), LoopStats()
    ran: list[str] = []
    cancelled = generate(loop, 6, 10)
    cancelled.handle.cancel()
    kv.submit(cancelled)
    late = ExclusiveJob(lambda: ran.append("late"))
    for job in (
        Exclusive(ExclusiveJob(lambda: ran.append("first"))),
        cancelled,  # lined up; the next exclusive job starts it first
        Exclusive(ExclusiveJob(lambda: ran.append("second"))),
        Stop(),
        Exclusive(late),
    ):
        jobs.put(job)
    Scheduler(jobs, _parts(), kv, stats, max_batch=1).run()
    assert ran == ["first", "second"]
    assert stats.outcomes == {"completed": 0, "cancelled": 1, "failed": 0}
    assert (kv.incoming, len(kv.line), kv.running_tokens) == ([], 0, 0)
    assert jobs.get_nowait() == Exclusive(late) and not late.future.done()

    async def events() -> list[type]:
        return [type(event) async for event in cancelled.handle]

    assert loop.run_until_complete(events()) == [Cancelled]

"""A byte budget bounds the running requests together (``--kv-budget``, and
the KV room ``--memory-budget`` leaves): requests beyond it wait in line for a
slot, first come first served, and ``/stats`` reports ``batch.kv_bytes`` and
``kv_budget_bytes``. Unit tests of the arithmetic and the line, then the tiny
random model's engine, whose greedy answers must not change."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxspec.cli.flags import parse_config
from mlxspec.conformance.httpx_checks import checking_async_client
from mlxspec.conformance.live import serve
from mlxspec.engine import (
    AdmissionLimits,
    BudgetTooSmallError,
    Engine,
    GenerationRequest,
    RequestHandle,
)
from mlxspec.engine.loop.admission import Admission, QueueFullError
from mlxspec.engine.loop.jobs import Generate
from mlxspec.engine.loop.kv_ledger import KvGate
from mlxspec.engine.model.fit import ModelMemory
from mlxspec.engine.types import Delta, Finished, LogitsParams
from mlxspec.http.app import create_app

MEMORY = ModelMemory(weights_bytes=1000, kv_bytes_per_token=10, kv_dtype="float16", layers=2)
MAX_TOKENS = 6


class Job:
    """A stand-in for a request handle: only ``cancelled`` is read."""

    def __init__(self, name: str) -> None:
        self.name, self.cancelled = name, False


@pytest.fixture()
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """An event loop for request handles that are never iterated."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


def _submitted(adm: Admission, loop: asyncio.AbstractEventLoop, tokens: int) -> Generate:
    """A request projecting ``tokens`` of KV cache (a one-token prompt), submitted."""
    handle = RequestHandle(GenerationRequest((1,), max_tokens=tokens - 1), loop)
    job = Generate(handle, tokens - 1)
    adm.kv.submit(job)
    return job


# ------------------------------------------------------------------ unit


def test_kv_budget_caps_each_context_and_the_running_total() -> None:
    adm = Admission(AdmissionLimits(kv_budget=500), 8, 1000, MEMORY)
    assert (adm.enforced_context, adm.kv_room, adm.kv_bytes_per_token) == (50, 50, 10)
    # --memory-budget 2000 leaves 80 tokens (1000 of weights, 200 reserve); the smaller wins
    both = Admission(AdmissionLimits(memory_budget=2000, kv_budget=1000), 8, 1000, MEMORY)
    assert (both.enforced_context, both.kv_room) == (80, 80)
    memory_only = Admission(AdmissionLimits(memory_budget=2000), 8, 1000, MEMORY)
    assert memory_only.kv_room == 80
    assert Admission(AdmissionLimits(max_context=40), 8, 1000, MEMORY).kv_room is None


def test_kv_budget_below_two_tokens_is_a_startup_error() -> None:
    with pytest.raises(BudgetTooSmallError) as err:
        Admission(AdmissionLimits(kv_budget=15), 8, 1000, MEMORY)
    assert str(err.value) == (
        "--kv-budget of 15 bytes holds less than two tokens of KV cache (10 bytes each)"
    )


def test_gate_starts_the_head_while_it_fits_and_never_lets_others_overtake() -> None:
    gate = KvGate(room=100)
    a, b, c = Job("a"), Job("b"), Job("c")
    for job, tokens in ((a, 60), (b, 50), (c, 10)):
        gate.push(job, tokens)
    assert gate.pop_ready(running=0) == (a, 60)
    assert gate.pop_ready(running=60) is None  # b would make 110; c waits behind it
    assert len(gate) == 2
    assert gate.pop_ready(running=50) == (b, 50)
    assert gate.pop_ready(running=100) is None
    assert gate.pop_ready(running=90) == (c, 10)  # exactly the room
    assert gate.pop_ready(running=0) is None  # empty


def test_gate_lets_a_request_larger_than_the_room_run_alone() -> None:
    gate = KvGate(room=10)
    big = Job("big")
    gate.push(big, 500)
    assert gate.pop_ready(running=1) is None
    assert gate.pop_ready(running=0) == (big, 500)


def test_gate_without_room_starts_everything_and_drops_cancelled() -> None:
    gate = KvGate(room=None)
    jobs = [Job(str(i)) for i in range(4)]
    for job in jobs:
        gate.push(job, 10**9)
    jobs[1].cancelled = jobs[3].cancelled = True
    assert gate.drop_cancelled() == 2
    assert [gate.pop_ready(running=10**12) for _ in range(3)] == [
        (jobs[0], 10**9),
        (jobs[2], 10**9),
        None,
    ]


def test_requests_in_line_count_as_waiting() -> None:
    adm = Admission(AdmissionLimits(kv_budget=500), 8, 1000, MEMORY)
    adm.kv_gate.push(Job("x"), 40)
    adm.kv_gate.push(Job("y"), 40)
    # three in flight: one running, two in line though slots are free
    assert (adm.running(3), adm.waiting(3)) == (1, 2)


def test_queue_full_counts_the_line(loop: asyncio.AbstractEventLoop) -> None:
    adm = Admission(AdmissionLimits(max_queue=2, kv_budget=500), 8, 1000, MEMORY)  # 50 tokens
    adm.kv.line_up(_submitted(adm, loop, 40))
    adm.kv.start_next()  # one request runs
    adm.kv_gate.push(Job("x"), 40)  # one waits: 40 + 40 > 50
    adm.admit(10, in_flight=2, projected=40)  # it would be second in line: room for it
    adm.kv_gate.push(Job("y"), 40)
    with pytest.raises(QueueFullError):
        adm.admit(10, in_flight=3, projected=40)  # third in line, past --max-queue 2
    assert adm.rejected == {"queue_full": 1, "context_over_budget": 0}


def test_requests_not_yet_in_line_are_counted_too(loop: asyncio.AbstractEventLoop) -> None:
    """Several requests submitted within one engine step: none is in the line
    yet, but the prediction packs them first come first served."""
    adm = Admission(AdmissionLimits(max_queue=1, kv_budget=500), 8, 1000, MEMORY)
    for _ in range(2):  # submitted, not yet taken in by the engine
        _submitted(adm, loop, 40)
    assert adm.kv_waiting(40) == 2  # the first runs, the second and this one wait
    with pytest.raises(QueueFullError):
        adm.admit(10, in_flight=2, projected=40)
    assert adm.kv_waiting(10) == 2  # 40 + 10 would fit beside the first: no overtaking
    small = Admission(AdmissionLimits(max_queue=0, kv_budget=500), 8, 1000, MEMORY)
    _submitted(small, loop, 20)
    assert small.kv_waiting(20) == 0  # both fit: 40 <= 50
    small.admit(5, in_flight=1, projected=20)
    # without a byte budget there is no line
    assert Admission(AdmissionLimits(max_queue=0), 8, 1000).kv_waiting(10**6) == 0


def test_a_burst_gets_429_before_the_engine_sees_it(tiny_model_dir: Path, tiny_engine) -> None:
    """A budget for one request at a time and --max-queue 1: of three requests
    submitted at once (the engine thread is not even started), the third is
    refused at submit."""
    limits = AdmissionLimits(max_queue=1, kv_budget=_budget_for(tiny_engine, 1))
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=8, limits=limits)

    async def go() -> None:
        engine.submit(_request(engine, PROMPTS[0]))
        engine.submit(_request(engine, PROMPTS[1]))
        with pytest.raises(QueueFullError):
            engine.submit(_request(engine, PROMPTS[2]))

    try:
        asyncio.run(go())
        assert engine.admission.rejected["queue_full"] == 1
        assert list(engine.admission.kv.incoming) == [len(PROMPTS[0]) + MAX_TOKENS] * 2
    finally:
        engine.close()


def test_cli_reads_kv_budget(tiny_model_dir: Path) -> None:
    assert parse_config(["serve", str(tiny_model_dir), "--kv-budget", "2M"]).kv_budget == 2 << 20
    assert parse_config(["serve", str(tiny_model_dir)]).kv_budget is None


# ------------------------------------------------------------- the engine


def _request(engine: Engine, text: str) -> GenerationRequest:
    return GenerationRequest(
        tuple(engine.text_prompt(text)),
        max_tokens=MAX_TOKENS,
        logits=LogitsParams(logit_bias=((2, -1e9),)),  # no EOS: every answer is full length
    )


#: Prompts of one length (one byte token per letter): every request projects
#: the same KV cache, so a budget of k and a half requests runs exactly k.
PROMPTS = ("abcdefgh", "ijkmnpqs", "uvwxyzab")


def _budget_for(tiny_engine: Any, requests: int) -> int:
    """Bytes of KV cache for ``requests`` and a half requests' projections."""
    (length,) = {len(tiny_engine.text_prompt(p)) for p in PROMPTS}
    each = length + MAX_TOKENS
    return tiny_engine.memory.kv_bytes_per_token * (each * requests + each // 2)


@pytest.fixture(scope="module", params=[1, 2], ids=["one-at-a-time", "two-at-a-time"])
def budget_engine(request, tiny_model_dir: Path, tiny_engine: Any) -> Iterator[tuple[Engine, int]]:
    limits = AdmissionLimits(kv_budget=_budget_for(tiny_engine, request.param))
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=8, limits=limits)
    engine.start()
    yield engine, request.param
    engine.close()


async def _timed(handle: Any) -> tuple[str, float, float]:
    """The answer text, and when its first token and its end arrived."""
    text, first, end = "", 0.0, 0.0
    async for event in handle:
        if isinstance(event, Delta):
            first = first or time.monotonic()
            text += event.text
        elif isinstance(event, Finished):
            end = time.monotonic()
    return text, first, end


def test_requests_beyond_the_budget_wait_and_answer_the_same(
    budget_engine: tuple[Engine, int], tiny_engine: Any
) -> None:
    engine, fits = budget_engine

    async def go(e: Any) -> list[tuple[str, float, float]]:
        handles = [e.submit(_request(e, p)) for p in PROMPTS]
        return await asyncio.wait_for(asyncio.gather(*(_timed(h) for h in handles)), 120)

    budgeted = asyncio.run(go(engine))
    free = asyncio.run(go(tiny_engine))
    assert [text for text, _, _ in budgeted] == [text for text, _, _ in free]
    assert all(len(text) > 0 for text, _, _ in budgeted)
    # at no moment do more than `fits` requests run: the (fits+1)-th starts
    # only after the first has ended, and in submission order
    for i in range(fits, len(PROMPTS)):
        assert budgeted[i][1] >= budgeted[i - fits][2]
    assert engine.kv_gate.room == _budget_for(tiny_engine, fits) // (
        engine.memory.kv_bytes_per_token
    )
    assert len(engine.kv_gate) == 0


def test_free_engine_overlaps_the_same_requests(tiny_engine: Any) -> None:
    # the control: without a budget the third request starts before the first ends
    async def go() -> list[tuple[str, float, float]]:
        handles = [tiny_engine.submit(_request(tiny_engine, p)) for p in PROMPTS]
        return await asyncio.wait_for(asyncio.gather(*(_timed(h) for h in handles)), 120)

    runs = asyncio.run(go())
    assert runs[2][1] < runs[0][2]


def test_a_cancelled_request_in_line_never_starts(budget_engine: tuple[Engine, int]) -> None:
    engine, fits = budget_engine

    async def go() -> tuple[list[Any], list[Any]]:
        handles = [engine.submit(_request(engine, p)) for p in PROMPTS]
        last = handles[-1]
        last.cancel()  # still in line: one or two run before it
        done = await asyncio.wait_for(asyncio.gather(*(_timed(h) for h in handles[:-1])), 120)
        return list(done), [event async for event in last]

    before = dict(engine.counters)
    done, events = asyncio.run(go())
    assert all(text for text, _, _ in done)
    assert not any(isinstance(e, Delta) for e in events)
    # the engine thread counts an ending just after the event that ends the stream
    asyncio.run(_until(lambda: engine.counters["completed"] == before["completed"] + 2))
    assert engine.counters["cancelled"] == before["cancelled"] + 1


def test_stats_report_kv_bytes_and_budget(budget_engine: tuple[Engine, int]) -> None:
    """Two exclusive jobs hold the engine thread still: the completion queued
    between them has started (it is taken into line before the second job runs)
    when ``/stats`` is read, and cannot have ended."""
    engine, _ = budget_engine
    app = create_app(engine, validate_responses=True)
    per_token = engine.memory.kv_bytes_per_token
    first, second = threading.Event(), threading.Event()

    async def go() -> tuple[dict, dict]:
        transport = httpx.ASGITransport(app=app)
        async with checking_async_client("http://localhost", transport=transport, timeout=60) as c:
            hold_first = asyncio.ensure_future(engine.run_exclusive(first.wait))
            submitted = engine.submitted
            body = {"prompt": "hello there", "max_tokens": 40, "logit_bias": {"2": -100}}
            task = asyncio.create_task(c.post("/v1/completions", json=body))
            await _until(lambda: engine.submitted > submitted)
            hold_second = asyncio.ensure_future(engine.run_exclusive(second.wait))
            first.set()
            await hold_first
            await _until(lambda: engine.running_kv_tokens > 0)
            during = (await c.get("/stats")).json()
            second.set()
            await hold_second
            assert (await task).status_code == 200
            await _until(lambda: engine.running_kv_tokens == 0)
            return during, (await c.get("/stats")).json()

    try:
        during, after = asyncio.run(go())
    finally:
        first.set()
        second.set()
    prompt = len(engine.text_prompt("hello there"))
    projected = min(prompt + 40, engine.admission.context_limit)  # max_tokens is capped
    assert during["batch"]["kv_bytes"] == projected * per_token
    assert during["batch"]["kv_budget_bytes"] == engine.kv_gate.room * per_token
    assert (during["batch"]["active_rows"], during["batch"]["pending_rows"]) == (1, 0)
    assert after["batch"]["kv_bytes"] == 0


async def _until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.002)


def test_serial_lane_reports_the_running_request(tiny_model_dir: Path, tiny_engine) -> None:
    """``--batch 1`` runs a request to its end inside one engine step: its
    projection is reported while it runs, and cleared after."""
    per_token = tiny_engine.memory.kv_bytes_per_token
    limits = AdmissionLimits(kv_budget=per_token * 230)
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=1, limits=limits)
    engine.start()
    request = GenerationRequest(
        tuple(engine.text_prompt(PROMPTS[0])),
        max_tokens=200,
        logits=LogitsParams(logit_bias=((2, -1e9),)),
    )

    async def go() -> tuple[int, str]:
        handle = engine.submit(request)
        await _until(lambda: engine.running_kv_tokens > 0)
        seen = engine.running_kv_tokens
        text, _, _ = await _timed(handle)
        return seen, text

    try:
        seen, text = asyncio.run(go())
        assert seen == len(request.prompt) + 200
        assert text
        asyncio.run(_until(lambda: engine.running_kv_tokens == 0))
    finally:
        engine.close()


def test_serve_reports_the_budget_and_its_cap(
    tiny_model_dir: Path, tiny_engine: Any, tmp_path: Path
) -> None:
    """``mlxspec serve --kv-budget``: the start-up line names the context cap,
    and ``/stats`` the budget."""
    per_token = tiny_engine.memory.kv_bytes_per_token
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "mlxspec", "serve", str(tiny_model_dir), "--port", "{port}"]
    budget = ["--kv-budget", str(per_token * 100), "--batch", "2"]
    log = tmp_path / "serve.log"
    with serve([*argv, *budget], env, log, timeout=120) as base:
        stats = httpx.get(f"{base}/stats", timeout=30).json()
    assert stats["admission"]["enforced_context_tokens"] == 100
    assert stats["batch"]["kv_budget_bytes"] == per_token * 100
    assert "(context 256, capped at 100 by the operator's limits)" in log.read_text()

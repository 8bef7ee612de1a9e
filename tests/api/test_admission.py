"""Admission: the bounded wait queue (429 queue_full) and the operator context
cap (400 context_over_budget, max_tokens capped to the room left)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlxspec.cli.flags import parse_config
from mlxspec.cli.main import load_engine
from mlxspec.conformance.httpx_checks import checking_async_client
from mlxspec.engine import AdmissionLimits, BudgetTooSmallError, Engine, EngineRequestError
from mlxspec.engine.loop.admission import Admission, ContextBudgetError, QueueFullError
from mlxspec.engine.model.fit import ModelMemory
from mlxspec.engine.model.loader import ModelLoadError
from mlxspec.http.app import create_app

#: Keeps the tiny random model from ending early on EOS (``<|im_end|>`` is id 2).
NO_EOS = {"2": -100}
MEMORY = ModelMemory(weights_bytes=1000, kv_bytes_per_token=10, kv_dtype="float16", layers=2)


# ------------------------------------------------------------------ unit


def test_waiting_and_running_split_in_flight_at_the_slots() -> None:
    adm = Admission(AdmissionLimits(max_queue=2), slots=3, window=100)
    assert [(adm.running(n), adm.waiting(n)) for n in (0, 3, 5)] == [(0, 0), (3, 0), (3, 2)]


def test_queue_full_at_max_queue_waiting() -> None:
    adm = Admission(AdmissionLimits(max_queue=2), slots=3, window=100)
    adm.admit(10, in_flight=4)  # one waiting: room for another
    with pytest.raises(QueueFullError) as err:
        adm.admit(10, in_flight=5)
    assert err.value.message == "generation queue is full (2 requests waiting); retry later"
    assert adm.rejected == {"queue_full": 1, "context_over_budget": 0}


def test_max_queue_zero_refuses_only_requests_that_would_wait() -> None:
    adm = Admission(AdmissionLimits(max_queue=0), slots=2, window=100)
    adm.admit(10, in_flight=1)  # a slot is free
    with pytest.raises(QueueFullError):
        adm.admit(10, in_flight=2)


def test_n_choices_are_admitted_all_or_none() -> None:
    adm = Admission(AdmissionLimits(max_queue=2), slots=3, window=100)
    adm.admit(10, in_flight=0, count=5)  # 3 decode, 2 wait: exactly the room
    with pytest.raises(QueueFullError) as err:
        adm.admit(10, in_flight=1, count=5)  # the fifth choice would wait third
    assert err.value.message == (
        "the generation queue has no room for this request's 5 choices "
        "(0 of its 2 places taken); retry later"
    )
    with pytest.raises(EngineRequestError) as never:
        adm.admit(10, in_flight=0, count=6)  # more than the server ever holds
    assert type(never.value) is EngineRequestError  # a 400, not a 429 to retry
    assert (never.value.message, never.value.param) == (
        "n=6 choices cannot run on this server: it decodes at most 3 at once and queues "
        "at most 2 more (--batch, --max-queue); ask for at most 5.",
        "n",
    )
    assert adm.rejected == {"queue_full": 1, "context_over_budget": 0}


def test_hold_counts_while_held_and_refuses_like_admit() -> None:
    adm = Admission(AdmissionLimits(max_queue=1), slots=1, window=100)
    with adm.hold(in_flight=1, job="embedding"):  # the one waiting place
        assert adm.held == 1
        with pytest.raises(QueueFullError) as err, adm.hold(in_flight=2, job="decision"):
            pass
        assert adm.held == 1  # a refused hold takes nothing
    # one queue for every job: the refusal names the job it refused, not a generation
    assert err.value.message == (
        "queue is full (1 request waiting); this decision request was not queued, retry later"
    )
    assert adm.held == 0
    assert adm.rejected == {"queue_full": 1, "context_over_budget": 0}


def test_no_cap_means_the_window_only() -> None:
    adm = Admission(AdmissionLimits(), slots=1, window=100)
    assert (adm.enforced_context, adm.context_limit) == (None, 100)
    assert adm.room(90, None) == 10
    assert adm.room(90, 5) == 5


def test_max_context_caps_and_refuses() -> None:
    adm = Admission(AdmissionLimits(max_context=40), slots=1, window=100)
    assert adm.enforced_context == 40
    assert adm.room(30, 1000) == 10  # max_tokens is a ceiling
    with pytest.raises(ContextBudgetError) as err:
        adm.admit(40, in_flight=0, param="prompt")
    assert (err.value.message, err.value.param) == (
        "The prompt has 40 tokens, leaving no room to generate within this server's "
        "context limit of 40 tokens.",
        "prompt",
    )
    assert adm.rejected == {"queue_full": 0, "context_over_budget": 1}


def test_max_context_above_the_window_is_the_window() -> None:
    adm = Admission(AdmissionLimits(max_context=500), 1, 100)
    assert adm.enforced_context == 100
    # the model's window is the bound a client hits, so errors name it
    assert adm.context_words() == "This model's maximum context length is 100 tokens"


def test_memory_budget_leaves_kv_room_after_weights_and_reserve() -> None:
    # 2000 bytes: 1000 of weights, 200 (10%) reserve, 800 / 10 bytes per token.
    adm = Admission(AdmissionLimits(memory_budget=2000), 1, 1000, MEMORY)
    assert adm.enforced_context == 80
    # decisions and embeddings over it name the server's limit, not the model's
    assert adm.context_words() == "This server's context limit is 80 tokens"
    both = Admission(AdmissionLimits(max_context=50, memory_budget=2000), 1, 1000, MEMORY)
    assert both.enforced_context == 50


def test_budget_below_the_weights_is_a_startup_error() -> None:
    with pytest.raises(BudgetTooSmallError) as err:
        Admission(AdmissionLimits(memory_budget=1000), 1, 1000, MEMORY)
    assert str(err.value) == (
        "--memory-budget of 1000 bytes leaves no room for the KV cache: the weights "
        "take 1000 bytes and each token of context 10 bytes"
    )
    with pytest.raises(BudgetTooSmallError, match="--max-context 1 leaves no room"):
        Admission(AdmissionLimits(max_context=1), 1, 1000)


def test_cli_reports_a_too_small_budget_as_a_load_error(tiny_model_dir: Path) -> None:
    config = parse_config(["serve", str(tiny_model_dir), "--memory-budget", "1K"])
    assert config.memory_budget == 1024
    with pytest.raises(ModelLoadError, match=r"^--memory-budget of 1024 bytes leaves no room"):
        load_engine(config)


# ------------------------------------------------------------- over HTTP


@pytest.fixture(scope="module")
def idle_engine(tiny_model_dir: Path) -> Iterator[Engine]:
    """A serial engine that is not started yet: submitted requests stay queued
    until the test starts it, so the queue fills deterministically."""
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=1, limits=AdmissionLimits(1))
    yield engine
    engine.close()


async def _until(predicate, timeout: float = 30.0) -> None:
    """Yield to the event loop until ``predicate()`` holds (the ASGI app runs on it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition never held"
        await asyncio.sleep(0.005)


def test_queue_full_is_429_then_queued_requests_complete(idle_engine: Engine) -> None:
    app = create_app(idle_engine, validate_responses=True)
    body = {"prompt": "hello", "max_tokens": 3}

    async def go() -> None:
        transport = httpx.ASGITransport(app=app)
        async with checking_async_client("http://localhost", transport=transport, timeout=60) as c:
            # One request takes the single slot, one waits (max_queue=1).
            held = [asyncio.ensure_future(c.post("/v1/completions", json=body)) for _ in range(2)]
            await _until(lambda: idle_engine.in_flight == 2)
            full = await c.post("/v1/completions", json=body)
            streamed = await c.post("/v1/completions", json={**body, "stream": True})
            stats = (await c.get("/stats")).json()
            await asyncio.sleep(0.2)  # both wait at least this long before starting
            idle_engine.start()
            done = await asyncio.gather(*held)
            metrics = (await c.get("/metrics")).text
        families = text_string_to_metric_families(metrics)
        queue = {s.name: s.value for f in families for s in f.samples}
        assert queue["mlxspec_request_queue_time_seconds_count"] == 2
        assert queue["mlxspec_request_queue_time_seconds_sum"] >= 0.4
        for refused in (full, streamed):
            assert refused.status_code == 429
            assert refused.headers["retry-after"] == "1"
            assert refused.headers["content-type"] == "application/json"
            assert refused.json() == {
                "error": {
                    "message": "generation queue is full (1 request waiting); retry later",
                    "type": "resource_admission",
                    "param": None,
                    "code": "queue_full",
                }
            }
        assert [r.status_code for r in done] == [200, 200]
        assert stats["admission"]["queue_depth"] == 1
        assert stats["admission"]["in_flight"] == 2
        assert stats["admission"]["rejected"] == {"queue_full": 2, "context_over_budget": 0}
        assert stats["batch"]["active_rows"] == 1

    asyncio.run(go())
    assert idle_engine.counters["completed"] == 2
    assert idle_engine.in_flight == 0


def test_n_choices_that_do_not_fit_take_nothing_from_other_requests(tiny_model_dir: Path) -> None:
    # Not started: requests stay in flight until the test starts the engine.
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=1, limits=AdmissionLimits(1))
    app = create_app(engine, validate_responses=True)
    body = {"prompt": "hello", "max_tokens": 3}

    async def go() -> None:
        transport = httpx.ASGITransport(app=app)
        async with checking_async_client("http://localhost", transport=transport, timeout=60) as c:
            never = await c.post(
                "/v1/chat/completions",
                json={
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 3,
                    "n": 3,
                },
            )
            held = asyncio.ensure_future(c.post("/v1/completions", json=body))
            await _until(lambda: engine.in_flight == 1)
            pair = await c.post("/v1/completions", json={**body, "n": 2})  # 1 slot + 1 place
            assert engine.in_flight == 1  # no choice of the refused pair was queued
            waiting = asyncio.ensure_future(c.post("/v1/completions", json=body))
            await _until(lambda: engine.in_flight == 2)  # the place the pair did not take
            engine.start()
            done = await asyncio.gather(held, waiting)
            pair_later = await c.post("/v1/completions", json={**body, "n": 2})
        assert never.status_code == 400
        assert never.json()["error"]["param"] == "n"
        assert never.json()["error"]["message"].startswith("n=3 choices cannot run")
        assert pair.status_code == 429
        assert pair.json()["error"]["message"] == (
            "the generation queue has no room for this request's 2 choices "
            "(0 of its 1 place taken); retry later"
        )
        assert [r.status_code for r in done] == [200, 200]
        assert pair_later.status_code == 200
        assert [c["index"] for c in pair_later.json()["choices"]] == [0, 1]

    asyncio.run(go())
    engine.close()
    assert engine.counters["cancelled"] == 0  # refused choices are not cancelled generations
    assert engine.counters["completed"] == 4
    assert engine.submitted == 4


def queue_full(message: str) -> dict:
    """The 429 body of a refusal for a full queue."""
    return {
        "error": {
            "message": message,
            "type": "resource_admission",
            "param": None,
            "code": "queue_full",
        }
    }


QUEUE_FULL = queue_full("generation queue is full (1 request waiting); retry later")
DECISION = {
    "model": "m",
    "input": "The sky is blue.",
    "questions": [{"type": "predicate", "name": "blue", "instructions": "Is the sky blue?"}],
}
SYSTEMONE = {
    "model": "m",
    "state": "late",
    "questions": {"late": {"type": "noul", "instructions": "Is it late?"}},
}


def test_decisions_take_a_queue_place_and_get_429_when_it_is_full(tiny_model_dir: Path) -> None:
    # Not started: the held completion and decision stay in flight until the test starts it.
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=1, limits=AdmissionLimits(1))
    app = create_app(engine, validate_responses=True)
    completion = {"prompt": "hello", "max_tokens": 3}

    async def go() -> None:
        transport = httpx.ASGITransport(app=app)
        async with checking_async_client("http://localhost", transport=transport, timeout=60) as c:
            # The completion takes the only slot; the decision is the one waiting.
            held = [
                asyncio.ensure_future(c.post("/v1/completions", json=completion)),
                asyncio.ensure_future(c.post("/v1/decisions", json=DECISION)),
            ]
            await _until(lambda: engine.in_flight == 2 and engine.admission.held == 1)
            refused = [
                await c.post("/v1/completions", json=completion),
                await c.post("/v1/decisions", json=DECISION),
                await c.post("/v1/systemone", json=SYSTEMONE),
            ]
            stats = (await c.get("/stats")).json()["admission"]
            engine.start()
            done = await asyncio.gather(*held)
            after = await c.post("/v1/systemone", json=SYSTEMONE)
        decision_full = queue_full(
            "queue is full (1 request waiting); this decision request was not queued, retry later"
        )
        expected = [QUEUE_FULL, decision_full, decision_full]
        # System One keeps OpenAI's envelope outside validation
        for r, body in zip(refused, expected, strict=True):
            assert (r.status_code, r.headers["retry-after"], r.json()) == (429, "1", body)
        assert (stats["queue_depth"], stats["in_flight"]) == (1, 2)
        assert stats["rejected"] == {"queue_full": 3, "context_over_budget": 0}
        assert [r.status_code for r in done] == [200, 200]
        assert done[1].json()["answers"][0]["name"] == "blue"
        assert after.status_code == 200
        assert list(after.json()["answers"]) == ["late"]

    try:
        asyncio.run(go())
        assert (engine.in_flight, engine.admission.held) == (0, 0)
    finally:
        engine.close()


def test_embeddings_take_a_queue_place_too(tmp_path: Path) -> None:
    from fixtures.tiny_embedding import build_tiny_qwen3_embedding

    folder = build_tiny_qwen3_embedding(tmp_path / "tiny-qwen3")
    engine = Engine.load(folder, "tiny-qwen3-embedding", max_batch=1, limits=AdmissionLimits(1))
    app = create_app(engine, validate_responses=True)
    body = {"model": "m", "input": "hello"}

    async def go() -> None:
        transport = httpx.ASGITransport(app=app)
        async with checking_async_client("http://localhost", transport=transport, timeout=60) as c:
            held = [asyncio.ensure_future(c.post("/v1/embeddings", json=body)) for _ in range(2)]
            await _until(lambda: engine.in_flight == 2)
            refused = await c.post("/v1/embeddings", json=body)
            engine.start()
            done = await asyncio.gather(*held)
        assert (refused.status_code, refused.headers["retry-after"]) == (429, "1")
        assert refused.json() == queue_full(
            "queue is full (1 request waiting); this embedding request was not queued, retry later"
        )
        assert [r.status_code for r in done] == [200, 200]
        assert done[0].json()["data"] == done[1].json()["data"]

    try:
        asyncio.run(go())
        assert (engine.in_flight, engine.admission.held) == (0, 0)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def capped_engine(tiny_model_dir: Path) -> Iterator[Engine]:
    engine = Engine.load(tiny_model_dir, "tiny-llama", limits=AdmissionLimits(max_context=24))
    engine.start()
    yield engine
    engine.close()


def _post(app, path: str, body: dict) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with checking_async_client("http://localhost", transport=transport, timeout=60) as c:
            return await c.post(path, json=body)

    return asyncio.run(go())


def test_prompt_over_the_operator_cap_is_400_context_over_budget(capped_engine: Engine) -> None:
    app = create_app(capped_engine, validate_responses=True)
    prompt = "the world is round, he said"
    n = len(capped_engine.text_prompt(prompt))
    assert 24 <= n < capped_engine.info.context_window
    r = _post(app, "/v1/completions", {"prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": f"The prompt has {n} tokens, leaving no room to generate within "
            "this server's context limit of 24 tokens.",
            "type": "memory_admission",
            "param": "prompt",
            "code": "context_over_budget",
        }
    }
    chat = _post(app, "/v1/chat/completions", {"messages": [{"role": "user", "content": prompt}]})
    assert (chat.status_code, chat.json()["error"]["param"]) == (400, "messages")
    assert chat.json()["error"]["code"] == "context_over_budget"


def test_a_decision_over_the_operator_cap_names_the_server_limit(capped_engine: Engine) -> None:
    app = create_app(capped_engine, validate_responses=True)
    question = {"type": "predicate", "name": "round", "instructions": "Is it round?"}
    body = {"model": "m", "input": "the world is round, he said", "questions": [question]}
    r = _post(app, "/v1/decisions", body)
    assert r.status_code == 400, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("This server's context limit is 24 tokens, but the decision prompt")
    assert capped_engine.admission.context_words() == "This server's context limit is 24 tokens"


def test_max_tokens_is_capped_to_the_room_left(capped_engine: Engine) -> None:
    app = create_app(capped_engine, validate_responses=True)
    prompt = "hello"
    n = len(capped_engine.text_prompt(prompt))
    body = {"prompt": prompt, "max_tokens": 1000, "logit_bias": NO_EOS}
    r = _post(app, "/v1/completions", body)
    assert r.status_code == 200, r.text
    usage, choice = r.json()["usage"], r.json()["choices"][0]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (n, 24 - n)
    assert choice["finish_reason"] == "length"
    asked = {"stream": True, "stream_options": {"include_usage": True}}
    stream = _post(app, "/v1/completions", {**body, **asked})
    frames = [json.loads(line[6:]) for line in stream.text.split("\n\n") if line[6:7] == "{"]
    assert frames[-1]["usage"]["completion_tokens"] == 24 - n


def test_stats_reports_the_cap(capped_engine: Engine) -> None:
    app = create_app(capped_engine, validate_responses=True)

    async def go() -> dict:
        transport = httpx.ASGITransport(app=app)
        async with checking_async_client("http://localhost", transport=transport) as c:
            return (await c.get("/stats")).json()

    admission = asyncio.run(go())["admission"]
    assert admission["enforced_context_tokens"] == 24
    assert admission["memory_budget_bytes"] is None
    assert admission["max_safe_context"] == 24  # the cap binds before memory does


@pytest.mark.parametrize("exclusive_between", [False, True])
def test_a_request_cancelled_behind_a_serial_one_frees_its_place(
    tmp_path: Path, exclusive_between: bool
) -> None:
    from fixtures.tiny_model import build_tiny_llama
    from mlxspec.engine import Delta, GenerationRequest, LogitsParams

    model = build_tiny_llama(tmp_path / "long", context=4096)
    engine = Engine.load(model, "tiny-llama", max_batch=1, limits=AdmissionLimits(1))
    engine.start()
    no_eos = LogitsParams(logit_bias=((2, -1e9),))

    async def go() -> tuple[int, int, int]:
        long = engine.submit(GenerationRequest(prompt=(5, 6, 7), max_tokens=3000, logits=no_eos))
        async for event in long:  # the long request runs: its first token
            assert isinstance(event, Delta)
            break
        # an exclusive job (a decision's or embeddings' work) queued ahead of the one cancelled
        job = asyncio.ensure_future(engine.run_exclusive(lambda: 42)) if exclusive_between else None
        await asyncio.sleep(0)  # the job is queued before the next request
        behind = engine.submit(GenerationRequest(prompt=(5, 6), max_tokens=2))
        with pytest.raises(QueueFullError):  # one running, one waiting: the queue is full
            engine.submit(GenerationRequest(prompt=(8,), max_tokens=1))
        behind.cancel()
        deadline = asyncio.get_running_loop().time() + 10
        while engine.in_flight > 1:  # counted out between the long request's tokens
            assert asyncio.get_running_loop().time() < deadline, "the place was never freed"
            await asyncio.sleep(0.005)
        completed, cancelled = engine.counters["completed"], engine.counters["cancelled"]
        after = engine.submit(GenerationRequest(prompt=(8,), max_tokens=1))  # room again
        long.cancel()
        async for _ in after:
            pass
        if job is not None:
            assert await job == 42  # it ran after the serial request, in order
        # the engine counts a request just after its Finished event goes out
        while engine.in_flight:
            assert asyncio.get_running_loop().time() < deadline + 10, "a request never ended"
            await asyncio.sleep(0.005)
        return completed, cancelled, engine.counters["completed"]

    try:
        completed, cancelled, finally_completed = asyncio.run(go())
    finally:
        engine.close()
    assert (completed, cancelled) == (0, 1)  # freed while the long request still ran
    assert finally_completed == 1

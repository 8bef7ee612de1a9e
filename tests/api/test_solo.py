"""A lone request decodes on ``generate_step`` and moves into the batch when
another arrives: output identical to running alone, wherever the move happens."""

from __future__ import annotations

import asyncio
import json
from typing import NamedTuple

import pytest

from mlxspec.engine import (
    Cancelled,
    Constraint,
    Delta,
    Engine,
    Finished,
    GenerationRequest,
    LogitsParams,
    RequestHandle,
    SamplingParams,
)
from mlxspec.engine.caches.prompt_cache import PromptCache
from mlxspec.engine.loop.batching import BatchLane
from mlxspec.engine.loop.solo import SoloRun

NO_EOS = LogitsParams(logit_bias=((2, -1e9),))
#: Strong enough to change the tiny model's greedy output after 8 tokens.
PENALTIES = LogitsParams(logit_bias=((2, -1e9),), presence_penalty=0.1, frequency_penalty=2.0)
#: Near-uniform sampling with a seed: the draws, not the logits, pick the tokens.
HOT_SEEDED = SamplingParams(temperature=50.0, seed=5)
SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
    },
    "required": ["kind", "age"],
}
JSON_SCHEMA = Constraint("json_schema", json.dumps(SCHEMA), any_whitespace=False)


def _engine(tiny_engine: Engine, max_batch: int) -> Engine:
    """An engine on the tiny model without a prompt cache, prefilling 8 tokens a step."""
    engine = Engine(
        tiny_engine.model,
        tiny_engine.tokenizer,
        tiny_engine.info,
        tiny_engine.defaults,
        max_batch=max_batch,
        prompt_cache=PromptCache(0),
        prefill_step=8,
    )
    engine.start()
    return engine


@pytest.fixture(scope="module")
def serial_engine(tiny_engine):
    engine = _engine(tiny_engine, 1)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def batch_engine(tiny_engine):
    engine = _engine(tiny_engine, 8)
    yield engine
    engine.close()


class Result(NamedTuple):
    text: str
    ids: list[int]
    logprobs: list[tuple[int, float, list[int]]]  # id, logprob (4 places), top ids
    finished: Finished


async def collect(handle: RequestHandle, on_delta=None) -> Result:
    text, ids, lps, fin = "", [], [], None
    async for ev in handle:
        if isinstance(ev, Delta):
            text += ev.text
            ids += ev.token_ids
            lps += [(lp.id, round(lp.logprob, 4), [t.id for t in lp.top]) for lp in ev.logprobs]
            if on_delta is not None:
                on_delta(len(ids))
        elif isinstance(ev, Finished):
            fin = ev
    return Result(text, ids, lps, fin)


def alone(engine: Engine, request: GenerationRequest) -> Result:
    async def go():
        return await collect(engine.submit(request))

    return asyncio.run(go())


def moved_after(engine: Engine, request: GenerationRequest, steps: int) -> Result:
    """Run ``request`` as a SoloRun for ``steps`` steps, hand it to a fresh
    batch and finish it there, all on ``engine``'s thread."""

    async def go():
        handle = RequestHandle(request, asyncio.get_running_loop())

        def work() -> None:
            parts = engine.lane_parts
            solo = SoloRun(handle, parts, request.max_tokens, lane="batched")
            for _ in range(steps):
                if solo.step():
                    return
            handoff = solo.handoff()
            if handoff is None:
                return
            lane = BatchLane(parts, 4, on_done=lambda _handle, _outcome: None)
            lane.adopt(handoff)
            while len(lane):
                lane.step()
            lane.close()

        await engine.run_exclusive(work)
        return await collect(handle)

    return asyncio.run(go())


def prompt(engine: Engine, text: str = "the quick brown fox jumps") -> tuple[int, ...]:
    return tuple(engine.text_prompt(text))


# ------------------------------------------------- the move itself, at every point
@pytest.mark.parametrize("steps", [0, 1, 2, 3, 4, 5, 7, 9, 13, 20])
@pytest.mark.parametrize(
    "kind",
    ["greedy", "penalties", "grammar", "stop", "logprobs", "seeded"],
)
def test_handoff_at_any_step_gives_the_solo_output(
    batch_engine, serial_engine, kind, steps
) -> None:
    """The prompt (24 tokens) takes 2 prefill chunks of 8 before ``generate_step``
    gets the last 8 and yields the first token, so 0-2 steps move it before or
    mid-prefill and later ones mid-decode. At 7 steps the stop string completes
    on the token sampled ahead, at 13 the 12-token budget does: the request ends
    in the handoff itself."""
    base = prompt(batch_engine)
    assert len(base) == 24
    # logprobs on: every token arrives in a Delta (text may be held back).
    request = {
        "greedy": GenerationRequest(base, max_tokens=24, logits=NO_EOS, logprobs=True),
        "penalties": GenerationRequest(base, max_tokens=24, logits=PENALTIES, logprobs=True),
        "grammar": GenerationRequest(base, max_tokens=60, constraint=JSON_SCHEMA, logprobs=True),
        "stop": GenerationRequest(base, max_tokens=40, logits=NO_EOS, stop=("s" * 6,)),
        "logprobs": GenerationRequest(base, max_tokens=12, logits=NO_EOS, top_logprobs=3),
        # its random stream carries over the move (the same sampler object)
        "seeded": GenerationRequest(
            base, max_tokens=24, logits=NO_EOS, sampling=HOT_SEEDED, logprobs=True
        ),
    }[kind]
    got, want = moved_after(batch_engine, request, steps), alone(serial_engine, request)
    assert (got.text, got.ids, got.logprobs) == (want.text, want.ids, want.logprobs)
    assert (got.finished.finish_reason, got.finished.completion_tokens) == (
        want.finished.finish_reason,
        want.finished.completion_tokens,
    )
    assert (got.finished.lane, want.finished.lane) == ("batched", "serial")
    if kind == "grammar":
        assert json.loads(got.text)["kind"] in ("cat", "dog")
        assert got.finished.finish_reason == "stop"
    if kind == "penalties":  # the bias and penalties act on both sides of the move
        plain = GenerationRequest(base, max_tokens=24, logits=NO_EOS, logprobs=True)
        assert got.text != alone(serial_engine, plain).text
    if kind == "stop":  # the matcher's held-back "s"s carry over the move
        assert (got.text, got.finished.finish_reason, got.finished.completion_tokens) == (
            "",
            "stop",
            6,
        )
    elif kind != "logprobs":
        assert got.finished.completion_tokens == len(got.ids)


# ------------------------------------------------------------ through the engine
def arrive_midway(engine: Engine, first: GenerationRequest, second: GenerationRequest):
    """Submit ``second`` once ``first`` (running alone) has produced 5 tokens;
    returns both results and the order they finished in."""

    async def go():
        order, later = [], []

        async def run_second():
            result = await collect(engine.submit(second))
            order.append("second")
            return result

        def on_delta(count: int) -> None:
            if count >= 5 and not later:
                later.append(asyncio.ensure_future(run_second()))

        result = await collect(engine.submit(first), on_delta)
        order.append("first")
        return result, await later[0], order

    return asyncio.run(asyncio.wait_for(go(), 120))


@pytest.mark.parametrize("logits", [NO_EOS, PENALTIES], ids=["greedy", "penalties"])
def test_second_arrival_moves_the_lone_request_into_the_batch(
    batch_engine, serial_engine, logits
) -> None:
    first = GenerationRequest(prompt(batch_engine), max_tokens=200, logits=logits, logprobs=True)
    second = GenerationRequest(prompt(batch_engine, "hello"), max_tokens=6, logprobs=True)
    moves = batch_engine.handoffs
    got_first, got_second, order = arrive_midway(batch_engine, first, second)
    # The short one finished first: the two decoded together.
    assert order == ["second", "first"]
    assert batch_engine.handoffs == moves + 1
    for got, request in ((got_first, first), (got_second, second)):
        want = alone(serial_engine, request)
        assert (got.text, got.ids, got.logprobs) == (want.text, want.ids, want.logprobs)
        assert got.finished.completion_tokens == want.finished.completion_tokens
        assert got.finished.lane == "batched"
    assert got_first.finished.completion_tokens == 200


def test_cancelled_lone_request_frees_the_engine(batch_engine, serial_engine) -> None:
    first = GenerationRequest(prompt(batch_engine), max_tokens=200, logits=NO_EOS)
    second = GenerationRequest(prompt(batch_engine, "hello"), max_tokens=6, logprobs=True)
    before = dict(batch_engine.counters)
    moves = batch_engine.handoffs

    async def go():
        handle = batch_engine.submit(first)
        events = []
        async for ev in handle:
            events.append(type(ev).__name__)
            if isinstance(ev, Delta):
                handle.cancel()
        return events, await collect(batch_engine.submit(second))

    events, got = asyncio.run(asyncio.wait_for(go(), 60))
    assert events[-1] == Cancelled.__name__
    want = alone(serial_engine, second)
    assert (got.text, got.ids) == (want.text, want.ids)
    assert batch_engine.handoffs == moves  # it was gone, not moved, when the second came
    assert batch_engine.counters["cancelled"] == before["cancelled"] + 1
    assert batch_engine.counters["completed"] == before["completed"] + 1
    assert batch_engine.in_flight == 0


def test_lone_request_starts_from_the_prompt_cache(tiny_engine, serial_engine) -> None:
    """A lone request in the batched lane (``tiny_engine``: batch 8, prompt cache on)
    keeps its KV cache and the next one starts from it."""
    base = tuple(tiny_engine.text_prompt("a solo turn about caches"))
    moves = tiny_engine.handoffs
    turn1 = alone(tiny_engine, GenerationRequest(base, max_tokens=8, logits=NO_EOS, logprobs=True))
    follow = (*base, *turn1.ids, *tiny_engine.text_prompt(" and more"))
    request = GenerationRequest(follow, max_tokens=8, logits=NO_EOS, logprobs=True)
    turn2 = alone(tiny_engine, request)
    # Prompt plus all 8 generated tokens were in the KV cache when turn 1 ended.
    assert turn2.finished.cached_tokens == len(base) + 8
    assert (turn1.finished.lane, turn2.finished.lane) == ("batched", "batched")
    want = alone(serial_engine, request)
    assert (turn2.text, turn2.ids, want.finished.cached_tokens) == (want.text, want.ids, 0)
    assert tiny_engine.handoffs == moves


@pytest.mark.parametrize("xtc", [False, True], ids=["seeded", "seeded-xtc"])
def test_seeded_arrival_beside_a_lone_request(batch_engine, serial_engine, xtc) -> None:
    """A seeded request arriving while a lone request decodes joins it in the
    batch (its own random stream); one using XTC (MLX's global stream) runs on
    the serial lane to its end while the lone one waits. Either way both give
    their alone outputs."""
    first = GenerationRequest(prompt(batch_engine), max_tokens=200, logits=NO_EOS)
    xtc_on = {"xtc_probability": 0.5, "xtc_threshold": 0.1} if xtc else {}
    seeded = GenerationRequest(
        prompt(batch_engine, "hello"),
        max_tokens=6,
        sampling=SamplingParams(temperature=0.8, seed=7, **xtc_on),
        logits=NO_EOS,
    )
    moves = batch_engine.handoffs

    async def go():
        started = asyncio.Event()
        first_task = asyncio.ensure_future(
            collect(batch_engine.submit(first), on_delta=lambda n: n == 3 and started.set())
        )
        await started.wait()
        return await collect(batch_engine.submit(seeded)), await first_task

    got_seeded, got_first = asyncio.run(asyncio.wait_for(go(), 120))
    assert got_seeded.finished.lane == ("serial" if xtc else "batched")
    assert got_first.finished.lane == "batched"
    # with XTC the lone request was not moved; else it moved into the batch
    assert batch_engine.handoffs == moves + (0 if xtc else 1)
    for got, request in ((got_first, first), (got_seeded, seeded)):
        want = alone(serial_engine, request)
        assert (got.text, got.ids) == (want.text, want.ids)
    assert batch_engine.in_flight == 0


def test_closing_the_engine_cancels_a_lone_request(tiny_engine) -> None:
    """Shutdown while a lone request decodes: its stream ends with ``Cancelled``
    and ``close`` returns (the engine thread exits, nothing is left running)."""
    engine = _engine(tiny_engine, 8)
    request = GenerationRequest(prompt(engine), max_tokens=200, logits=NO_EOS)
    thread = engine._thread
    assert thread is not None

    async def go():
        handle = engine.submit(request)
        kinds = []
        async for ev in handle:
            kinds.append(type(ev).__name__)
            if len(kinds) == 3:
                await asyncio.to_thread(engine.close)
        return kinds

    kinds = asyncio.run(asyncio.wait_for(go(), 60))
    assert kinds[-1] == Cancelled.__name__
    assert kinds.count(Delta.__name__) < 200
    assert not thread.is_alive()

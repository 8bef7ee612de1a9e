"""Continuous batching: concurrent requests give the serial results, join and
leave between steps, and a cancelled row frees its slot."""

from __future__ import annotations

import asyncio
import time

import pytest

from mlxspec.engine import Delta, Engine, Finished, GenerationRequest, LogitsParams, SamplingParams
from tests.helpers import text_and_finish

NO_EOS = LogitsParams(logit_bias=((2, -1e9),))


async def run_all(engine: Engine, requests: list[GenerationRequest]) -> list[tuple[str, Finished]]:
    return await asyncio.gather(*(text_and_finish(engine, r) for r in requests))


@pytest.fixture(scope="module")
def serial_engine(tiny_model_dir):
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=1)
    engine.start()
    yield engine
    engine.close()


def prompts(engine: Engine) -> list[tuple[int, ...]]:
    texts = ["hello", "the world", "or", "he said", "abc", "tell me", "x", "hell"]
    return [tuple(engine.text_prompt(t)) for t in texts]


def test_concurrent_greedy_equals_serial(tiny_engine, serial_engine) -> None:
    reqs = [GenerationRequest(p, max_tokens=6 + i) for i, p in enumerate(prompts(tiny_engine))]
    batched = asyncio.run(run_all(tiny_engine, reqs))
    serial = [asyncio.run(run_all(serial_engine, [r]))[0] for r in reqs]
    assert [t for t, _ in batched] == [t for t, _ in serial]
    for (_, b), (_, s) in zip(batched, serial, strict=True):
        assert (b.finish_reason, b.completion_tokens, b.prompt_tokens) == (
            s.finish_reason,
            s.completion_tokens,
            s.prompt_tokens,
        )
        assert (b.lane, s.lane) == ("batched", "serial")


def test_mixed_settings_in_one_batch(tiny_engine, serial_engine) -> None:
    base = prompts(tiny_engine)
    reqs = [
        GenerationRequest(base[0], max_tokens=5, logits=NO_EOS),
        GenerationRequest(base[1], max_tokens=7, logits=LogitsParams(repetition_penalty=1.3)),
        GenerationRequest(base[2], max_tokens=4, stop=("o",)),
        GenerationRequest(base[3], max_tokens=6, sampling=SamplingParams(top_k=1, temperature=1.0)),
    ]
    batched = asyncio.run(run_all(tiny_engine, reqs))
    serial = [asyncio.run(run_all(serial_engine, [r]))[0] for r in reqs]
    assert [t for t, _ in batched] == [t for t, _ in serial]
    assert [f.completion_tokens for _, f in batched] == [f.completion_tokens for _, f in serial]


def test_seeded_requests_share_the_batch_and_reproduce(tiny_engine, serial_engine) -> None:
    """A seed is a request-local random stream (the reference): seeded requests
    decode in the batch beside others, their draws do not depend on their
    batch-mates, and they give what they give alone on the serial lane."""
    p = prompts(tiny_engine)
    hot = [SamplingParams(temperature=50.0, seed=s) for s in (3, 3, 4)]
    seeded = [
        GenerationRequest(p[i], max_tokens=8, sampling=hot[i], logits=NO_EOS) for i in (0, 1, 2)
    ]
    others = [GenerationRequest(q, max_tokens=8, logits=NO_EOS) for q in p[3:6]]
    together = asyncio.run(run_all(tiny_engine, seeded + others))
    assert [f.lane for _, f in together] == ["batched"] * 6
    alone = [asyncio.run(run_all(serial_engine, [r]))[0] for r in seeded]
    assert [t for t, _ in together[:3]] == [t for t, _ in alone]
    assert len({t for t, _ in together[:3]}) == 3  # different prompts or seeds
    again = asyncio.run(run_all(tiny_engine, [seeded[0]]))[0]
    assert again[0] == together[0][0]


def test_seeded_requests_with_xtc_run_serially(tiny_engine) -> None:
    """XTC draws its coin from MLX's global stream: such a seeded request seeds
    it and runs alone, as mlx_lm.server runs every seeded request."""
    xtc = SamplingParams(temperature=1.0, seed=3, xtc_probability=0.5, xtc_threshold=0.1)
    req = GenerationRequest(prompts(tiny_engine)[0], max_tokens=4, sampling=xtc)
    ((first, fin),) = asyncio.run(run_all(tiny_engine, [req]))
    assert fin.lane == "serial"
    assert asyncio.run(run_all(tiny_engine, [req]))[0][0] == first


def test_cancelled_row_leaves_batch_and_others_finish(tiny_engine) -> None:
    p = prompts(tiny_engine)

    async def go():
        long = tiny_engine.submit(GenerationRequest(p[0], logits=NO_EOS))
        others = asyncio.gather(
            *(
                run_all(tiny_engine, [GenerationRequest(q, max_tokens=5, logits=NO_EOS)])
                for q in p[1:4]
            )
        )
        async for ev in long:
            if isinstance(ev, Delta):
                long.cancel()
        return await others

    before = tiny_engine.counters["cancelled"]
    results = asyncio.run(asyncio.wait_for(go(), 60))
    finals = [r[0][1] for r in results]
    assert [(f.completion_tokens, f.finish_reason) for f in finals] == [(5, "length")] * 3
    assert tiny_engine.counters["cancelled"] == before + 1


def test_a_request_waiting_for_a_batch_row_counts_as_not_started(tiny_model_dir) -> None:
    """With more requests than rows, mlx-lm's generator holds the extra ones
    until a row frees: their ``started_at`` (where queue time ends, for the
    metrics) is when their prefill begins, not when they were handed to it."""
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=2)
    engine.start()

    async def go() -> tuple[list, list[float]]:
        reqs = [GenerationRequest((5 + i, 6, 7), max_tokens=120, logits=NO_EOS) for i in range(4)]
        handles = [engine.submit(r) for r in reqs]
        finished_at: list[float] = [0.0] * 4

        async def drain(i: int) -> None:
            async for event in handles[i]:
                if isinstance(event, Finished):
                    finished_at[i] = time.monotonic()

        await asyncio.gather(*(drain(i) for i in range(4)))
        return handles, finished_at

    try:
        handles, finished_at = asyncio.run(go())
    finally:
        engine.close()
    first_two_done = min(finished_at[:2])
    for h in handles[:2]:
        assert h.started_at - h.submitted_at < first_two_done - h.submitted_at
    for h in handles[2:]:  # they began once a first row had finished its 120 tokens
        assert h.started_at >= min(h0.started_at for h0 in handles[:2])
        assert h.started_at > first_two_done - 0.5 * (first_two_done - handles[0].started_at)

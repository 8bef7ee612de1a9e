"""mlxspec's batched decode step (``loop/decode.py``) against mlx-lm's
reference loops on the tiny random model: every row's greedy tokens, with its
``logit_bias`` and penalties, equal mlx-lm's ``generate_step`` run on that row
alone and mlx-lm's ``BatchGenerator`` run on the same rows, token for token,
while rows join mid-way (long prompts prefilled a chunk at a time, short ones
together), leave when done and one is cancelled in flight."""

from __future__ import annotations

import asyncio
from typing import Any

import mlx.core as mx
import pytest

from mlxspec.engine import Engine, GenerationRequest, LogitsParams
from mlxspec.engine.loop.decode import DecodeBatch, Slot, Token
from mlxspec.engine.loop.handles import RequestHandle
from mlxspec.engine.loop.lanes import Handoff
from mlxspec.engine.loop.rows import Row
from mlxspec.engine.sampling.sampler import build_logits_processors, build_sampler

NO_EOS = LogitsParams(logit_bias=((2, -1e9),))
PENALISED = LogitsParams(
    logit_bias=((2, -1e9), (70, 3.0)),
    repetition_penalty=1.4,
    repetition_context_size=5,
    presence_penalty=0.6,
    frequency_penalty=2.0,
)
#: Never run: the tests read tokens, not a request's events (closed at the end).
LOOP = asyncio.new_event_loop()


@pytest.fixture(scope="module", autouse=True)
def _close_loop():
    yield
    LOOP.close()


#: (prompt text, max tokens, logits settings): prompts from 1 to ~40 tokens,
#: so with prefill_step 8 some take several chunks alone before their last one.
CASES = [
    ("hello", 9, NO_EOS),
    ("the quick brown fox jumps over the lazy dog", 12, NO_EOS),
    ("x", 6, PENALISED),
    ("tell me about the rivers and the bridges of old towns, at length", 10, PENALISED),
    ("or", 14, NO_EOS),
    ("he said that the weather would turn", 7, NO_EOS),
]


def _handoff(engine: Engine, prompt: tuple[int, ...], max_tokens: int, logits) -> Handoff:
    request = GenerationRequest(prompt, max_tokens=max_tokens, logits=logits, logprobs=True)
    handle = RequestHandle(request, LOOP)
    row = Row(handle, engine.tokenizer, frozenset(), lane="batched")
    return Handoff(
        row=row,
        feed=list(prompt),
        held=[],
        cache=None,
        max_tokens=max_tokens,
        sampler=build_sampler(request.sampling, []),
        processors=build_logits_processors(logits),
    )


def _alone(model: Any, prompt: tuple[int, ...], max_tokens: int, logits) -> list[int]:
    from mlx_lm.generate import generate_step

    steps = generate_step(
        mx.array(prompt, dtype=mx.uint32),
        model,
        max_tokens=max_tokens,
        logits_processors=build_logits_processors(logits),
        prefill_step_size=8,
    )
    return [token for token, _ in steps]


def _batch_generator(
    model: Any, prompts: list[tuple[int, ...]], budgets, logits
) -> list[list[int]]:
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, stop_tokens=[], completion_batch_size=8, prefill_step_size=8)
    uids = gen.insert(
        [list(p) for p in prompts],
        max_tokens=list(budgets),
        logits_processors=[build_logits_processors(lp) for lp in logits],
    )
    out: dict[int, list[int]] = {u: [] for u in uids}
    while any(len(out[u]) < b for u, b in zip(uids, budgets, strict=True)):
        for r in gen.next_generated():
            out[r.uid].append(r.token)
    gen.close()
    return [out[u] for u in uids]


def _run_batch(engine: Engine, cases, cancel_at: int | None = None) -> tuple[list, dict]:
    """Decode ``cases`` in one DecodeBatch (the first half joins first, the rest
    three steps later); returns each row's tokens and logprob values, and the
    batch's counters."""
    batch = DecodeBatch(engine.model, prefill_step=8, max_rows=8, prefill_rows=3)
    prompts = [tuple(engine.text_prompt(t)) for t, _, _ in cases]
    slots: list[Slot] = []
    got: dict[int, list[int]] = {}
    values: dict[int, list[float]] = {}

    def add(i: int) -> None:
        slot = batch.add(_handoff(engine, prompts[i], cases[i][1], cases[i][2]))
        slots.append(slot)
        got[id(slot)], values[id(slot)] = [], []

    def route(tokens: list[Token]) -> None:
        done = []
        for t in tokens:
            got[id(t.slot)].append(t.id)
            assert t.logprobs is not None
            values[id(t.slot)].append(t.logprobs.value)
            if t.slot.generated >= t.slot.budget:
                done.append(t.slot)
        batch.remove(done)

    half = len(cases) // 2
    for i in range(half):
        add(i)
    steps = 0
    while len(batch):
        if steps == 3:
            for i in range(half, len(cases)):
                add(i)
        if cancel_at is not None and steps == cancel_at:
            batch.remove([slots[0]])
        batch.step(route)
        steps += 1
    return [(got[id(s)], values[id(s)]) for s in slots], {"steps": steps, "reads": batch.clock}


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


def test_greedy_rows_equal_generate_step_alone_and_batch_generator(engine) -> None:
    def work():
        batched, _ = _run_batch(engine, CASES)
        prompts = [tuple(engine.text_prompt(t)) for t, _, _ in CASES]
        alone = [
            _alone(engine.model, p, n, lp) for p, (_, n, lp) in zip(prompts, CASES, strict=True)
        ]
        reference = _batch_generator(
            engine.model, prompts, [n for _, n, _ in CASES], [lp for _, _, lp in CASES]
        )
        return batched, alone, reference

    batched, alone, reference = asyncio.run(engine.run_exclusive(work))
    assert [tokens for tokens, _ in batched] == alone
    assert alone == reference
    assert [len(t) for t, _ in batched] == [n for _, n, _ in CASES]
    penalised = [i for i, (_, _, lp) in enumerate(CASES) if lp is PENALISED]
    plain = [tuple(engine.text_prompt(CASES[i][0])) for i in penalised]

    def unpenalised():
        return [
            _alone(engine.model, p, CASES[i][1], NO_EOS)
            for p, i in zip(plain, penalised, strict=False)
        ]

    # the penalties changed those rows' output, so the comparison above saw them act
    assert asyncio.run(engine.run_exclusive(unpenalised)) != [alone[i] for i in penalised]


def test_logprobs_of_batched_rows_equal_their_lone_values(engine) -> None:
    from mlx_lm.generate import generate_step

    def work():
        batched, _ = _run_batch(engine, CASES[:3])
        lone = []
        for text, n, lp in CASES[:3]:
            prompt = mx.array(engine.text_prompt(text), dtype=mx.uint32)
            steps = generate_step(
                prompt, engine.model, max_tokens=n, logits_processors=build_logits_processors(lp)
            )
            lone.append([lps[t].item() for t, lps in steps])
        return batched, lone

    batched, lone = asyncio.run(engine.run_exclusive(work))
    for (_, values), want in zip(batched, lone, strict=True):
        assert values == pytest.approx(want, abs=1e-4)


def test_a_row_removed_in_flight_leaves_the_others_unchanged(engine) -> None:
    def work():
        full, _ = _run_batch(engine, CASES)
        cut, _ = _run_batch(engine, CASES, cancel_at=2)
        return full, cut

    full, cut = asyncio.run(engine.run_exclusive(work))
    assert len(cut[0][0]) < len(full[0][0])
    assert [t for t, _ in cut[1:]] == [t for t, _ in full[1:]]


def test_one_host_read_per_decode_step(engine) -> None:
    """Pipelined: each step's tokens are read once, after the next step was
    queued, so the row's last token is read with one more step already queued
    (that one is dropped unread once the row left)."""

    def work():
        batch = DecodeBatch(engine.model, prefill_step=8, max_rows=4)
        prompt = tuple(engine.text_prompt("hello there"))
        reads: list[int] = []

        def route(tokens: list[Token]) -> None:
            reads.append(len(tokens))
            batch.remove([t.slot for t in tokens if t.slot.generated >= t.slot.budget])

        batch.add(_handoff(engine, prompt, 10, NO_EOS))
        while len(batch):
            batch.step(route)
        batch.step(route)  # nothing left: the queued step is not read
        return reads, batch.clock.steps

    reads, steps = asyncio.run(engine.run_exclusive(work))
    assert reads == [1] * 10
    assert steps == 11

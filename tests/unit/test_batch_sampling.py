"""The batched decode step's vectorised logits processors and sampler against
mlx-lm's per-row ones, on random logits (no model): each row of the batch must
come out as mlx-lm's ``make_logits_processors`` / ``make_sampler`` make it alone."""

from __future__ import annotations

import math

import mlx.core as mx
import pytest

from mlxspec.engine.sampling.batch_logits import BatchLogits
from mlxspec.engine.sampling.batch_sampler import (
    BatchSampler,
    LogprobPlan,
    RowSampling,
    logprob_rows,
)
from mlxspec.engine.sampling.sampler import build_logits_processors, build_sampler
from mlxspec.engine.types import LogitsParams, SamplingParams

VOCAB = 300

ROWS = [
    LogitsParams(),
    LogitsParams(logit_bias=((5, -1e9), (7, 2.5), (299, 0.75))),
    LogitsParams(repetition_penalty=1.3, repetition_context_size=6),
    LogitsParams(presence_penalty=0.7, presence_context_size=4),
    LogitsParams(frequency_penalty=0.4, frequency_context_size=9),
    LogitsParams(
        logit_bias=((3, -2.0),),
        repetition_penalty=0.8,
        repetition_context_size=0,  # mlx-lm's tokens[-0:]: the whole history
        presence_penalty=-0.3,
        frequency_penalty=1.1,
        frequency_context_size=100,
    ),
]


def _history(seed: int, n: int) -> list[int]:
    # a few repeated ids, so frequency counts are above one
    return [int(t) % 40 for t in mx.random.randint(0, 40, (n,), key=mx.random.key(seed)).tolist()]


def _reference(params: LogitsParams, tokens: list[int], logits: mx.array) -> mx.array:
    out = logits
    for processor in build_logits_processors(params):
        out = processor(mx.array(tokens), out)
    return out


@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16], ids=["f32", "bf16"])
def test_processors_match_mlx_lm_row_by_row_over_steps(dtype) -> None:
    """Six rows with every processor kind, over four steps (the history grows
    by each step's input inside the batch); rows join at two points."""
    histories = [_history(i, 3 + 5 * i) for i in range(len(ROWS))]
    batch = BatchLogits()
    batch.extend(ROWS[:4], histories[:4], [None] * 4)
    rows = 4
    for step in range(4):
        if step == 2:  # two more rows join mid-way
            batch.extend(ROWS[4:], histories[4:], [None, None])
            rows = len(ROWS)
        inputs = [int(t) % 40 for t in mx.random.randint(0, 40, (rows,)).tolist()]
        logits = (mx.random.normal((rows, VOCAB)) * 4).astype(dtype)
        got = batch(logits, mx.array(inputs, dtype=mx.uint32))
        for i in range(rows):
            histories[i].append(inputs[i])
            want = _reference(ROWS[i], histories[i], logits[i : i + 1])
            if ROWS[i].frequency_penalty:  # count * p once against p subtracted count times
                tol = 1e-5 if dtype == mx.float32 else 0.07
                assert mx.allclose(got[i : i + 1], want, atol=tol, rtol=0).item(), (step, i)
            else:
                assert mx.array_equal(got[i : i + 1], want).item(), (step, i)


def test_processors_follow_rows_that_leave() -> None:
    histories = [_history(10 + i, 8) for i in range(len(ROWS))]
    batch = BatchLogits()
    batch.extend(ROWS, histories, [None] * len(ROWS))
    keep = [5, 1, 2]
    batch.filter(keep)
    logits = mx.random.normal((3, VOCAB))
    inputs = [11, 12, 13]
    got = batch(logits, mx.array(inputs, dtype=mx.uint32))
    for j, i in enumerate(keep):
        want = _reference(ROWS[i], [*histories[i], inputs[j]], logits[j : j + 1])
        assert mx.allclose(got[j : j + 1], want, atol=1e-5).item()


def test_no_processor_leaves_the_logits_alone() -> None:
    batch = BatchLogits()
    batch.extend([LogitsParams()] * 3, [[1, 2], [3], []], [None] * 3)
    logits = mx.random.normal((3, VOCAB))
    assert batch(logits, mx.array([1, 2, 3])) is logits


SAMPLINGS = [
    SamplingParams(),  # greedy
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.3, min_p=0.05),
    SamplingParams(temperature=0.9, top_k=12),
    SamplingParams(temperature=1.0, top_p=0.5, min_p=0.1, top_k=3),
    SamplingParams(temperature=1e-7),  # under GREEDY_BELOW: greedy
]


def _filtered(params: SamplingParams, logprobs: mx.array) -> mx.array:
    """What mlx-lm's make_sampler chain keeps of one row (its filters, no draw)."""
    from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

    out = logprobs
    if 0 < params.top_p < 1.0:
        out = apply_top_p(out, params.top_p)
    if params.min_p:
        out = apply_min_p(out, params.min_p)
    if params.top_k:
        out = apply_top_k(out, params.top_k)
    return out


def test_sampled_rows_draw_only_what_mlx_lm_would_keep() -> None:
    """Over many draws, each sampled row's tokens fall inside mlx-lm's kept
    set for that row; greedy rows return the argmax."""
    sampler = BatchSampler()
    sampler.extend([RowSampling.of(p, build_sampler(p, [])) for p in SAMPLINGS])
    logits = mx.random.normal((len(SAMPLINGS), VOCAB)) * 3
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    kept = [
        set(mx.where(mx.isinf(_filtered(p, logprobs[i : i + 1]))[0], -1, mx.arange(VOCAB)).tolist())
        - {-1}
        for i, p in enumerate(SAMPLINGS)
    ]
    greedy = mx.argmax(logprobs, axis=-1).tolist()
    seen: list[set[int]] = [set() for _ in SAMPLINGS]
    for _ in range(200):
        for i, t in enumerate(sampler(logprobs).tolist()):
            seen[i].add(t)
    for i, p in enumerate(SAMPLINGS):
        if p.temperature < 1e-5:
            assert seen[i] == {greedy[i]}
        else:
            assert seen[i] <= kept[i], i
            assert len(seen[i]) > 1 or len(kept[i]) == 1
    assert len(kept[4]) <= 3 and seen[4] <= kept[4]


def test_top_p_mask_equals_mlx_lm_per_row() -> None:
    """The vectorised top-p/min-p/top-k masks are mlx-lm's, row by row (at a
    temperature that makes the draw the argmax of what is kept)."""
    from mlxspec.engine.sampling.batch_sampler import _draw, _Plan

    rows = [RowSampling(1.0, p, m, k) for p, m, k in ((0.9, 0.0, 0), (1.0, 0.2, 0), (0.8, 0.0, 7))]
    plan = _Plan.of(rows)
    logits = mx.random.normal((3, VOCAB)) * 2
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    for i, params in enumerate(
        [
            SamplingParams(temperature=1.0, top_p=0.9),
            SamplingParams(temperature=1.0, min_p=0.2),
            SamplingParams(temperature=1.0, top_p=0.8, top_k=7),
        ]
    ):
        want = mx.isinf(_filtered(params, logprobs[i : i + 1]))
        mx.random.seed(i)  # the draw itself: only what is kept can come out
        tokens = {_draw(logprobs, plan)[i].item() for _ in range(100)}
        assert all(not want[0, t].item() for t in tokens)


def test_seeded_and_xtc_rows_keep_their_own_samplers() -> None:
    seeded = SamplingParams(temperature=2.0, seed=9)
    xtc = SamplingParams(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.1)
    rows = [RowSampling.of(p, build_sampler(p, [])) for p in (SamplingParams(), seeded, xtc)]
    assert rows[0].custom is None and rows[1].custom is not None and rows[2].custom is not None
    logits = mx.random.normal((3, VOCAB))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    sampler = BatchSampler()
    sampler.extend(rows)
    got = sampler(logprobs).tolist()
    alone = build_sampler(seeded, [])  # a fresh stream of the same seed
    assert got[1] == alone(logprobs[1:2]).item()
    assert got[0] == mx.argmax(logprobs[0]).item()


def test_logprob_rows_match_the_per_row_reading() -> None:
    from mlxspec.engine.loop.rows import read_logprobs

    logits = mx.random.normal((4, VOCAB))
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    tokens = mx.array([3, 50, 7, 9], dtype=mx.uint32)
    plan = LogprobPlan.of([2, None, 0, 5])
    values, ids, top = logprob_rows(logprobs, tokens, plan)
    for j, (i, k) in enumerate(zip(plan.rows, plan.top, strict=True)):
        want = read_logprobs(tokens[i].item(), logprobs[i], k)
        assert math.isclose(values[j].item(), want.value, rel_tol=0, abs_tol=0)
        assert ids[j].tolist()[:k] == want.ids
        assert top[j].tolist()[:k] == want.values

"""The speculative-sampling acceptance rule (``engine/speculative/verify.py``)
checked statistically on the tiny random model's own distributions: whatever
the draft distribution ``q``, the token a verify step emits first follows the
target's sampling distribution ``p`` (Leviathan et al. 2023, Theorem 1), for a
draft model's sampled drafts and for prompt lookup's point-mass drafts; and a
rule that keeps every draft (the bug the test guards against) is seen to fail."""

from __future__ import annotations

import asyncio

import mlx.core as mx
import numpy as np
import pytest

from mlxspec.engine.sampling.batch_sampler import BatchSampler, RowSampling
from mlxspec.engine.speculative.verify import kept_runs, verify_graph

TRIALS = 20000
TOP_K = 6  # the rows sample from the six likeliest tokens: a support small enough to count


@pytest.fixture(scope="module")
def dists(tiny_engine):
    """``(p logprobs (2, vocab), q logprobs (vocab,))``: the tiny model's
    distributions after two prompts, and a flatter draft distribution of the first."""
    engine = tiny_engine

    def work():
        rows = []
        for text in ("the river ran by the old mill", "one two three"):
            prompt = mx.array(engine.text_prompt(text), dtype=mx.uint32)[None]
            logits = engine.model(prompt)[0, -1].astype(mx.float32)
            rows.append(logits / 6.0)  # a softer p: its top token ~0.8 of the top six
        p = mx.stack(rows)
        p = p - mx.logsumexp(p, axis=-1, keepdims=True)
        q = p[0] * 0.5  # flatter over the same top six: drafts pass often, not always
        q = q - mx.logsumexp(q)
        return p.tolist(), q.tolist()  # arrays of the engine thread's stream stay there

    p, q = asyncio.run(engine.run_exclusive(work))
    return mx.array(p), mx.array(q)


def _sampler(n: int) -> BatchSampler:
    sampler = BatchSampler()
    sampler.extend([RowSampling(1.0, 1.0, 0.0, TOP_K)] * n)
    return sampler


def _target(p_row) -> np.ndarray:
    """The distribution the sampler draws from: top-k of ``p_row``, renormalised."""
    probs = np.exp(np.array(p_row, dtype=np.float64))
    keep = np.argsort(-probs)[:TOP_K]
    out = np.zeros_like(probs)
    out[keep] = probs[keep]
    return out / out.sum()


def _first_tokens(p, drafts, q=None) -> np.ndarray:
    """The first emitted token of ``TRIALS`` verify steps of one draft each."""
    logprobs = mx.broadcast_to(p[None], (TRIALS, 2, p.shape[-1]))
    sampler = _sampler(TRIALS)
    scaled, drawn = sampler.scaled(logprobs)
    lengths = mx.ones((TRIALS,), dtype=mx.int32)
    accepted, stop = verify_graph(logprobs, drafts, lengths, scaled, drawn, q)
    runs = kept_runs(drafts.tolist(), accepted.tolist(), stop.tolist())
    return np.array([run[0] for run in runs])


def _tv(tokens: np.ndarray, want: np.ndarray) -> float:
    got = np.bincount(tokens, minlength=len(want)) / len(tokens)
    return 0.5 * float(np.abs(got - want).sum())


def test_draft_model_drafts_keep_the_target_distribution(tiny_engine, dists) -> None:
    p, q_logprobs = dists
    mx.random.seed(3)
    q_scaled, _ = _sampler(1).scaled(q_logprobs[None, None])
    q_probs = mx.softmax(q_scaled[0, 0], axis=-1)
    drafts = mx.random.categorical(mx.broadcast_to(q_scaled[0, 0], (TRIALS, q_scaled.shape[-1])))
    drafts = drafts.astype(mx.int32)[:, None]
    q = mx.broadcast_to(q_probs[None, None], (TRIALS, 1, q_probs.shape[-1]))
    want = _target(p[0].tolist())
    draft_dist = np.array(q_probs.tolist())
    assert 0.5 * np.abs(draft_dist - want).sum() > 0.1  # q really differs from p
    tokens = _first_tokens(p, drafts, q)
    assert _tv(tokens, want) < 0.025
    # keeping every draft would give q, not p
    assert _tv(np.array(drafts[:, 0].tolist()), want) > 0.1


def test_point_mass_drafts_keep_the_target_distribution(tiny_engine, dists) -> None:
    p, _ = dists
    mx.random.seed(4)
    want = _target(p[0].tolist())
    for draft in (int(np.argsort(-want)[0]), int(np.argsort(-want)[2]), 5):
        drafts = mx.full((TRIALS, 1), draft, dtype=mx.int32)
        tokens = _first_tokens(p, drafts)
        assert _tv(tokens, want) < 0.025, draft


def test_greedy_rows_keep_the_drafts_equal_to_the_argmax() -> None:
    logprobs = mx.log(mx.array([[[0.1, 0.7, 0.2], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]]))
    drafts = mx.array([[1, 2]], dtype=mx.int32)  # the first agrees, the second does not
    accepted, stop = verify_graph(logprobs, drafts, mx.array([2], dtype=mx.int32))
    assert kept_runs([[1, 2]], accepted.tolist(), stop.tolist()) == [[1, 0]]
    assert kept_runs([[1, 0]], [[True, True]], stop.tolist()) == [[1, 0, 2]]

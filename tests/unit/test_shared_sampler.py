"""Requests with the same sampling settings share one sampler object, so
mlx-lm's ``BatchGenerator`` samples their rows in one call (engine/sampling.py)."""

from __future__ import annotations

import mlx.core as mx

from mlxspec.engine.sampling.sampler import build_sampler
from mlxspec.engine.types import SamplingParams


def test_same_settings_give_the_same_sampler_and_other_settings_another():
    warm = SamplingParams(temperature=0.7, top_p=0.9, top_k=40)
    assert build_sampler(warm, [2]) is build_sampler(SamplingParams(**warm.__dict__), [2])
    assert build_sampler(warm, [2]) is not build_sampler(warm, [3])  # other XTC-exempt tokens
    other = SamplingParams(temperature=0.7, top_p=0.8, top_k=40)
    assert build_sampler(other, [2]) is not build_sampler(warm, [2])


def test_xtc_samplers_stay_per_request():
    # XTC draws one apply-or-not number per call: shared, one draw would decide every row
    xtc = SamplingParams(temperature=1.0, xtc_probability=0.5, xtc_threshold=0.1)
    assert build_sampler(xtc, [2]) is not build_sampler(xtc, [2])


def test_a_shared_sampler_samples_each_row_of_a_batch_on_its_own():
    # Three rows, each with one token holding ~99.9% of the mass at a different id:
    # top_p 0.5 keeps only that token, so each row must return its own argmax.
    vocab = 50
    logits = mx.full((3, vocab), -10.0)
    for row, tok in enumerate((7, 31, 2)):
        logits[row, tok] = 10.0
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    sampler = build_sampler(SamplingParams(temperature=1.0, top_p=0.5, seed=0), [])
    mx.random.seed(0)
    assert sampler(logprobs).tolist() == [7, 31, 2]
    # and a row-by-row call gives the same tokens (what unshared samplers did)
    assert [sampler(logprobs[i : i + 1]).item() for i in range(3)] == [7, 31, 2]

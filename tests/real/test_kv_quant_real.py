"""KV cache quantisation on the embedded SmolLM2-135M: greedy answers of eight
chat prompts decoded together with ``--kv-quant kv8`` and ``kv4`` agree with
full precision above the bounds measured on this model, and the KV bytes per
token fall by the layout's factor.

Measured (CPU, float32 activations, 8 prompts decoded at once, 16 and 24 tokens
each): the share of tokens before each answer's first divergence was 0.84 and
0.80 for kv8 (7 of 8 first tokens equal) and 0.20 and 0.16 for kv4 (4 of 8);
mlx-lm's own ``generate_step`` with ``kv_bits=4`` (which prefills the prompt
unquantised) kept 0.30. A 135M model is sensitive to 4-bit keys; the bounds
below sit under those figures and far above what a broken cache gives (about 0).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxspec.engine import Engine, GenerationRequest, KvOptions
from tests.api.test_kv_quant import _agreement, _ids, _together
from tests.real.test_speculation import _prompts

MAX_TOKENS = 10


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from mlxspec.engine.model.loader import resolve_model

    return resolve_model(None).path


def _answers(folder: Path, mode: str) -> tuple[list[list[int]], int]:
    engine = Engine.load(folder, "smollm2", max_batch=8, kv=KvOptions(mode))
    engine.start()
    try:
        requests = [GenerationRequest(p, max_tokens=MAX_TOKENS) for p in _prompts(engine)]
        answers = [_ids(d) for d in _together(engine, requests, timeout=900)]
        return answers, engine.memory.kv_bytes_per_token
    finally:
        engine.close()


def test_greedy_answers_agree_with_full_precision(model_dir: Path) -> None:
    full, full_bytes = _answers(model_dir, "bf16")
    kv8, kv8_bytes = _answers(model_dir, "kv8")
    kv4, kv4_bytes = _answers(model_dir, "kv4")
    assert all(len(a) == MAX_TOKENS for a in full)
    assert _agreement(kv8, full) >= 0.6
    assert sum(a[:1] == b[:1] for a, b in zip(kv8, full, strict=True)) >= 6
    assert _agreement(kv4, full) >= 0.1
    assert sum(a[:1] == b[:1] for a, b in zip(kv4, full, strict=True)) >= 3
    # float32 activations: 64-wide heads, a scale and a bias per 64 in float32
    assert full_bytes / kv8_bytes == pytest.approx(256 / 72)
    assert full_bytes / kv4_bytes == pytest.approx(256 / 40)

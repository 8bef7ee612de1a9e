"""The GPU path of attention over a quantised cache (``caches/quantized_kv.py``).

MLX's CUDA ``quantized_matmul`` has no kernel for attention shapes, so on a GPU
attention over a quantised cache dequantizes K/V and runs the fused attention.
These tests force the GPU branch on the CPU and compare it with mlx-lm's
quantised path on the same quantised arrays.
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models import base

from mlxspec.engine.caches.quantized_kv import (
    attention_on_any_device,
    dense_on_gpu,
    quantize,
)

ORIGINAL = getattr(
    base.quantized_scaled_dot_product_attention,
    "__wrapped__",
    base.quantized_scaled_dot_product_attention,
)


def _inputs(queries: int, keys: int, bits: int) -> tuple:
    mx.random.seed(7)
    q = mx.random.normal((2, 8, queries, 64))
    k = mx.random.normal((2, 2, keys, 64))  # GQA: 8 query heads over 2 KV heads
    v = mx.random.normal((2, 2, keys, 64))
    return q, quantize(k, 64, bits), quantize(v, 64, bits)


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("mask", ["causal", "array"])
def test_attention_on_a_gpu_gives_the_quantised_paths_answer(bits: int, mask: str) -> None:
    q, qk, qv = _inputs(7, 20, bits)
    m = "causal" if mask == "causal" else mx.tril(mx.ones((7, 20), mx.bool_), k=13)
    calls: list[int] = []

    def counted(*args, **kwargs):
        calls.append(1)
        return ORIGINAL(*args, **kwargs)

    dense = dense_on_gpu(counted, on_gpu=lambda: True)
    # copies: mlx-lm's function scales its queries in place (``queries *= scale``)
    want = ORIGINAL(mx.array(q), qk, qv, scale=0.125, mask=m, group_size=64, bits=bits)
    got = dense(mx.array(q), qk, qv, scale=0.125, mask=m, group_size=64, bits=bits)
    assert calls == []  # the quantised kernel was not called
    assert got.shape == want.shape == (2, 8, 7, 64)
    assert mx.allclose(got, want, atol=1e-4, rtol=1e-4).item(), mx.abs(got - want).max()


def test_one_query_on_a_gpu_too_and_the_cpu_keeps_the_quantised_kernel() -> None:
    calls: list[int] = []

    def counted(*args, **kwargs):
        calls.append(1)
        return ORIGINAL(*args, **kwargs)

    q, qk, qv = _inputs(1, 2049, 8)  # a decode step over 2049 cached tokens (the H100's failure)
    want = ORIGINAL(mx.array(q), qk, qv, scale=0.125, mask=None)
    got = dense_on_gpu(counted, on_gpu=lambda: True)(q, qk, qv, scale=0.125, mask=None)
    assert calls == []
    assert mx.allclose(got, want, atol=1e-4, rtol=1e-4).item()
    q7, qk7, qv7 = _inputs(7, 20, 8)
    dense_on_gpu(counted, on_gpu=lambda: False)(q7, qk7, qv7, scale=0.125, mask="causal")
    assert calls == [1]


def test_installed_once_in_mlx_lms_attention() -> None:
    attention_on_any_device()
    first = base.quantized_scaled_dot_product_attention
    attention_on_any_device()
    assert base.quantized_scaled_dot_product_attention is first
    assert first.__wrapped__ is ORIGINAL

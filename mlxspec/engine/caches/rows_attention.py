"""Decode attention over rows of different lengths, without a mask (CUDA).

A batch whose rows hold different numbers of tokens is left-padded
(:class:`~.batch_kv.RowsKVCache`), and mlx-lm masks the padding with an array
mask. mlx-cuda sends a one-token step with an array mask down its unfused
attention path (``supports_sdpa_vector`` refuses an array mask at head
dimensions under 256): on an H200 that cost 3-6 ms per decode step of a 7.4B
model at 1 to 64 rows, against 0.5-2.4 ms unmasked (``benchmarks/step_probe.py``,
``attn_ms`` / ``attn_mask_ms``). :func:`rows_attention` reads each row's
own start instead (:attr:`~.batch_kv.RowsKVCache.pads`): one
``mx.fast.cuda_kernel`` launch per layer, one thread block per (row, query
head), online softmax in float32 over positions ``[start, end)`` of the row.

It runs in place of mlx-lm's ``scaled_dot_product_attention`` in the model's
module (:func:`install`) only for one-token steps on a :class:`RowsKVCache`
that has padding, and only once it matched the masked attention on random
inputs at start-up (:func:`self_check`); everything else goes to mlx-lm's
function unchanged. :func:`reference_attention` is the masked computation it
replaces, which the tests and the self-check compare it against. On Metal and
the CPU, MLX's own attention takes the mask (nothing is installed).
"""

from __future__ import annotations

import functools
import logging
import os
import sys
from typing import Any, cast

log = logging.getLogger("mlxspec.engine")

#: Threads per block: four warps share a (row, query head), a quarter of the positions each.
THREADS = 128

_SOURCE = """
    constexpr int WARPS = 4;
    constexpr int E = D / 32;
    const int hq = blockIdx.x;
    const int b = blockIdx.y;
    const int Hq = q_shape[1];
    const int Hkv = k_shape[1];
    const int L = k_shape[2];
    const int hk = hq / (Hq / Hkv);
    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const float sc = scale[0];
    const int start = starts[b];
    const int end = ends[0];
    const T* qp = q + ((size_t)b * Hq + hq) * D + lane * E;
    float qv[E];
    for (int e = 0; e < E; ++e) qv[e] = static_cast<float>(qp[e]) * sc;
    const size_t base = ((size_t)b * Hkv + hk) * (size_t)L * D + lane * E;
    float m = -__int_as_float(0x7f800000), l = 0.f, acc[E];  // -infinity
    for (int e = 0; e < E; ++e) acc[e] = 0.f;
    for (int j = start + warp; j < end; j += WARPS) {
        const T* kr = k + base + (size_t)j * D;
        float s = 0.f;
        for (int e = 0; e < E; ++e) s += qv[e] * static_cast<float>(kr[e]);
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffff, s, o);
        const float mn = fmaxf(m, s);
        const float corr = expf(m - mn);
        const float p = expf(s - mn);
        l = l * corr + p;
        const T* vr = v + base + (size_t)j * D;
        for (int e = 0; e < E; ++e) acc[e] = acc[e] * corr + p * static_cast<float>(vr[e]);
        m = mn;
    }
    __shared__ float sm[WARPS];
    __shared__ float sl[WARPS];
    __shared__ float sacc[WARPS][D];
    if (lane == 0) {
        sm[warp] = m;
        sl[warp] = l;
    }
    for (int e = 0; e < E; ++e) sacc[warp][lane * E + e] = acc[e];
    __syncthreads();
    float M = sm[0];
    for (int w = 1; w < WARPS; ++w) M = fmaxf(M, sm[w]);
    float den = 0.f;
    for (int w = 0; w < WARPS; ++w) den += sl[w] * expf(sm[w] - M);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float num = 0.f;
        for (int w = 0; w < WARPS; ++w) num += sacc[w][d] * expf(sm[w] - M);
        out[((size_t)b * Hq + hq) * D + d] = static_cast<T>(num / den);
    }
"""


@functools.cache
def _kernel() -> Any:
    import mlx.core as mx

    return mx.fast.cuda_kernel(
        name="mlxspec_rows_attention",
        input_names=["q", "k", "v", "starts", "ends", "scale"],
        output_names=["out"],
        source=_SOURCE,
    )


def rows_attention(
    queries: Any, keys: Any, values: Any, starts: Any, end: int, scale: float
) -> Any:
    """One-token attention where row ``b`` attends to positions ``[starts[b], end)``.

    Args:
        queries (mx.array): shape ``(B, Hq, 1, D)``, ``D`` a multiple of 32 up to 256.
        keys (mx.array): shape ``(B, Hkv, L, D)`` with ``L >= end`` and ``Hq``
            a multiple of ``Hkv`` (grouped-query attention); row-contiguous
            (a KV cache's whole buffer, positions past ``end`` unread).
        values (mx.array): like ``keys``.
        starts (mx.array): shape ``(B,)``, ``int32``: each row's first position.
        end (int): one past the last position of every row.
        scale (float): applied to the queries (``1 / sqrt(D)`` for Llama).

    Returns:
        mx.array: shape ``(B, Hq, 1, D)``, the queries' dtype.
    """
    import mlx.core as mx

    batch, heads, _, dim = queries.shape
    (out,) = _kernel()(
        inputs=[
            queries,
            keys,
            values,
            starts,
            mx.array([end], dtype=mx.int32),
            mx.array([scale], dtype=mx.float32),
        ],
        template=[("T", queries.dtype), ("D", dim)],
        grid=(heads * THREADS, batch, 1),
        threadgroup=(THREADS, 1, 1),
        output_shapes=[(batch, heads, 1, dim)],
        output_dtypes=[queries.dtype],
    )
    return out


def reference_attention(
    queries: Any, keys: Any, values: Any, starts: Any, end: int, scale: float
) -> Any:
    """What :func:`rows_attention` computes, with MLX's own attention and a mask
    (what mlx-lm does with a left-padded ``BatchKVCache``). Same arguments."""
    import mlx.core as mx

    k, v = keys[..., :end, :], values[..., :end, :]
    mask = (mx.arange(end)[None] >= starts[:, None])[:, None, None, :]
    return mx.fast.scaled_dot_product_attention(queries, k, v, scale=scale, mask=mask)


def self_check() -> bool:
    """Whether :func:`rows_attention` runs here and matches
    :func:`reference_attention` on random inputs (bf16 and float32, rows of
    different lengths, grouped-query heads); False, with the reason logged,
    when it does not."""
    import mlx.core as mx

    try:
        for dtype, tol in ((mx.float32, 1e-4), (mx.bfloat16, 2e-2)):
            q = mx.random.normal((3, 8, 1, 128), key=mx.random.key(1)).astype(dtype)
            k = mx.random.normal((3, 2, 64, 128), key=mx.random.key(2)).astype(dtype)
            v = mx.random.normal((3, 2, 64, 128), key=mx.random.key(3)).astype(dtype)
            starts = mx.array([0, 5, 33], dtype=mx.int32)
            got = rows_attention(q, k, v, starts, 41, 128**-0.5)
            want = reference_attention(q, k, v, starts, 41, 128**-0.5)
            gap = mx.max(mx.abs(got.astype(mx.float32) - want.astype(mx.float32)))
            diff = cast(float, gap.item())
            if not diff <= tol:
                log.warning("rows attention off: it differs from MLX's by %.3g (%s)", diff, dtype)
                return False
    except Exception as exc:  # NVRTC or launch failures: keep MLX's masked path
        log.warning("rows attention off: %s", exc)
        return False
    return True


def available() -> bool:
    """Whether this machine runs :func:`rows_attention` (a CUDA GPU, the kernel
    passed :func:`self_check`, and ``MLXSPEC_ROWS_ATTENTION`` is not ``0``);
    checked once per process."""
    return _available()


@functools.cache
def _available() -> bool:
    import mlx.core as mx

    if os.environ.get("MLXSPEC_ROWS_ATTENTION", "1") == "0":  # A/B runs: MLX's masked path
        return False
    if mx.default_device().type != mx.gpu or not mx.cuda.is_available():
        return False
    return self_check()


def install(model: Any) -> bool:
    """Route the one-token attention of ``model``'s padded batch rows through
    :func:`rows_attention`: mlx-lm's ``scaled_dot_product_attention`` in the
    model's module is wrapped (once) so that a :class:`~.batch_kv.RowsKVCache`
    step with padding takes the kernel, and every other call mlx-lm's function.

    Args:
        model: an mlx-lm model (its class's module imports
            ``scaled_dot_product_attention`` from ``mlx_lm.models.base``).

    Returns:
        bool: whether the kernel is in use for this model.
    """
    module = sys.modules.get(type(model).__module__)
    original = getattr(module, "scaled_dot_product_attention", None)
    if module is None or original is None or not available():
        return False
    if getattr(original, "rows_attention", False):
        return True
    from mlxspec.engine.caches.batch_kv import RowsKVCache

    def attention(queries, keys, values, cache, scale, mask, sinks=None):  # mlx-lm's signature
        if (
            isinstance(cache, RowsKVCache)
            and not hasattr(cache, "bits")  # quantised K/V: mlx-lm's quantized matmuls
            and queries.shape[2] == 1
            and sinks is None
            and mask is not None
            and queries.shape[-1] % 32 == 0
            and queries.shape[-1] <= 256
            and cache.keys is not None
        ):
            return rows_attention(
                queries, cache.keys, cache.values, cache.starts(), cache.size(), scale
            )
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    attention.rows_attention = True  # type: ignore[attr-defined]
    module.scaled_dot_product_attention = attention  # type: ignore[attr-defined]
    log.info("rows attention: padded decode steps of %s skip the mask", type(model).__module__)
    return True

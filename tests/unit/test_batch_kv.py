"""The batched decode step's KV cache (``caches/batch_kv.py``) against mlx-lm's
``BatchKVCache``, and the padded-row attention (``caches/rows_attention.py``)
against MLX's masked attention: same arrays after every operation, the padding
mirrored on the host, no mask where no row is padded."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import BatchKVCache, KVCache

from mlxspec.engine.caches import rows_attention
from mlxspec.engine.caches.batch_kv import RowsKVCache, merge_rows

HEADS, DIM = 2, 8


def _row(length: int, seed: int) -> KVCache:
    cache = KVCache()
    if length:
        k = mx.random.normal((1, HEADS, length, DIM), key=mx.random.key(seed))
        cache.update_and_fetch(k, k * 2)
    return cache


def _same(ours: RowsKVCache, theirs: BatchKVCache) -> None:
    assert ours.pads == theirs.left_padding.tolist()
    assert ours.offset.tolist() == theirs.offset.tolist()
    assert ours._idx == theirs._idx
    if theirs.keys is None:
        assert ours.keys is None
        return
    n = theirs._idx
    assert mx.array_equal(ours.keys[..., :n, :], theirs.keys[..., :n, :]).item()
    assert mx.array_equal(ours.values[..., :n, :], theirs.values[..., :n, :]).item()


def test_every_operation_matches_batch_kv_cache() -> None:
    lengths = [5, 0, 9, 3]
    ours = RowsKVCache.merge([_row(n, i) for i, n in enumerate(lengths)])
    theirs = BatchKVCache.merge([_row(n, i) for i, n in enumerate(lengths)])
    _same(ours, theirs)
    # a right-padded prefill chunk of different lengths, then finalize
    chunk = [2, 4, 1, 4]
    for c in (ours, theirs):
        c.prepare(lengths=chunk, right_padding=[4 - n for n in chunk])
        k = mx.random.normal((4, HEADS, 4, DIM), key=mx.random.key(9))
        c.update_and_fetch(k, -k)
        c.finalize()
    _same(ours, theirs)
    for step in range(3):  # decode steps
        k = mx.random.normal((4, HEADS, 1, DIM), key=mx.random.key(20 + step))
        ours.update_and_fetch(k, k + 1)
        theirs.update_and_fetch(k, k + 1)
    _same(ours, theirs)
    other = [_row(n, 40 + n) for n in (12, 2)]
    ours.extend(RowsKVCache.merge(other))
    theirs.extend(BatchKVCache.merge(other))
    _same(ours, theirs)
    for keep in ([0, 2, 3, 4, 5], [4, 1], [1]):
        ours.filter(keep)
        theirs.filter(keep)
        _same(ours, theirs)


def test_extract_gives_each_rows_tokens() -> None:
    rows = [_row(n, i) for i, n in enumerate((4, 7, 1))]
    batch = RowsKVCache.merge([_row(n, i) for i, n in enumerate((4, 7, 1))])
    for i, row in enumerate(rows):
        got = batch.extract(i)
        assert got.offset == row.offset
        assert mx.array_equal(got.keys, row.keys[..., : row.offset, :]).item()


def test_no_mask_for_a_step_when_no_row_is_padded() -> None:
    even = RowsKVCache.merge([_row(6, 1), _row(6, 2)])
    assert even.make_mask(1) is None
    assert even.make_mask(3) is not None  # a prefill chunk keeps its causal mask
    uneven = RowsKVCache.merge([_row(6, 1), _row(2, 2)])
    mask = uneven.make_mask(1)
    assert mask is not None
    theirs = BatchKVCache.merge([_row(6, 1), _row(2, 2)]).make_mask(1)
    assert mx.array_equal(mask, theirs).item()


def test_merge_rows_batches_plain_caches_as_rows_caches() -> None:
    merged = merge_rows([[_row(3, 1), _row(3, 2)], [_row(5, 3), _row(5, 4)]])
    assert all(isinstance(c, RowsKVCache) for c in merged)
    assert [c.pads for c in merged] == [[2, 0], [2, 0]]


def test_reference_attention_is_the_left_padded_mask() -> None:
    from mlx_lm.models.base import create_causal_mask

    q = mx.random.normal((3, 4, 1, 32))
    k = mx.random.normal((3, 2, 10, 32))
    v = mx.random.normal((3, 2, 10, 32))
    starts = mx.array([0, 3, 7], dtype=mx.int32)
    mask = create_causal_mask(1, offset=9, left_padding=starts)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.2, mask=mask)
    got = rows_attention.reference_attention(q, k, v, starts, 10, 0.2)
    assert mx.allclose(got, want, atol=1e-6).item()


@pytest.mark.skipif(not rows_attention.available(), reason="needs the CUDA kernel")
@pytest.mark.parametrize("dtype", [mx.float32, mx.bfloat16, mx.float16])
def test_the_kernel_matches_the_reference(dtype) -> None:
    q = mx.random.normal((5, 32, 1, 128)).astype(dtype)
    k = mx.random.normal((5, 8, 300, 128)).astype(dtype)
    v = mx.random.normal((5, 8, 300, 128)).astype(dtype)
    starts = mx.array([0, 1, 17, 200, 279], dtype=mx.int32)
    got = rows_attention.rows_attention(q, k, v, starts, 280, 128**-0.5)
    want = rows_attention.reference_attention(q, k, v, starts, 280, 128**-0.5)
    tol = 1e-4 if dtype == mx.float32 else 2e-2
    assert mx.allclose(got.astype(mx.float32), want.astype(mx.float32), atol=tol).item()


def test_nothing_is_installed_without_the_kernel() -> None:
    if rows_attention.available():
        pytest.skip("the kernel runs here")
    from mlx_lm.models import llama

    before = llama.scaled_dot_product_attention
    model = llama.Model(
        llama.ModelArgs(
            model_type="llama",
            hidden_size=32,
            num_hidden_layers=1,
            intermediate_size=64,
            num_attention_heads=4,
            num_key_value_heads=2,
            rms_norm_eps=1e-5,
            vocab_size=50,
        )
    )
    assert rows_attention.install(model) is False
    assert llama.scaled_dot_product_attention is before

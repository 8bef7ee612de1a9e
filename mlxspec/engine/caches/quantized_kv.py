"""The batched decode step's KV cache in quantised form (``--kv-quant kv8|kv4``).

:class:`QuantizedRowsKVCache` is :class:`~.batch_kv.RowsKVCache` (padded rows,
per-row offsets, the host mirror of the padding, the verify step's per-row
rewind) whose keys and values are each stored as mlx-lm's
``QuantizedKVCache`` stores them: a tuple ``(packed, scales, biases)`` from
``mx.quantize`` over the head dimension, shapes ``(B, Hkv, L, D * bits / 32)``
``uint32`` and ``(B, Hkv, L, D / group_size)`` in the activation dtype twice.
Every position is quantised on its own (groups run along the head dimension),
so padding, rolling, filtering and joining rows move positions exactly as the
full-precision cache does.

Attention needs nothing of ours: a cache with ``bits`` sends mlx-lm's
``scaled_dot_product_attention`` (``mlx_lm.models.base``) to
``quantized_scaled_dot_product_attention``, two ``mx.quantized_matmul`` s with
the batch's mask (``None`` when no row is padded, as for the full-precision
cache). Single-row caches (the prompt cache, the SSD tier, the lone lane) are
mlx-lm's own ``QuantizedKVCache``: :meth:`QuantizedRowsKVCache.merge` takes
them (or full-precision ``KVCache`` s, quantised on the way in) and
:meth:`QuantizedRowsKVCache.extract` gives them back.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from mlx_lm.models.cache import KVCache, QuantizedKVCache, dynamic_roll

from mlxspec.engine.caches.batch_kv import RowsKVCache

#: ``(packed, scales, biases)``: one quantised tensor (``mx.quantize``'s output).
Parts = tuple[Any, Any, Any]


def quantize(x: Any, group_size: int, bits: int) -> Parts:
    """``mx.quantize`` of ``x`` over its last axis, as a tuple.

    Args:
        x (mx.array): shape ``(..., D)``, ``D`` a multiple of ``group_size``.
        group_size (int): elements sharing one scale and bias (32, 64 or 128).
        bits (int): bits per element (4 or 8).

    Returns:
        tuple: ``(packed uint32, scales, biases)``, scales in ``x`` 's dtype.
    """
    import mlx.core as mx

    packed, scales, biases = mx.quantize(x, group_size=group_size, bits=bits)
    return packed, scales, biases


def _each(parts: Parts, fn: Callable[[Any], Any]) -> Parts:
    a, b, c = (fn(p) for p in parts)
    return a, b, c


def single_row(cache: Any, group_size: int, bits: int) -> QuantizedKVCache:
    """A single-row cache in quantised form: ``cache`` itself when it already is
    one, else a ``KVCache`` quantised over the tokens it holds (mlx-lm's
    ``KVCache.to_quantized`` without the buffer's unused tail)."""
    if isinstance(cache, QuantizedKVCache):
        return cache
    out: Any = QuantizedKVCache(group_size=group_size, bits=bits)
    if cache.keys is not None and cache.offset > 0:
        out.keys = quantize(cache.keys[..., : cache.offset, :], group_size, bits)
        out.values = quantize(cache.values[..., : cache.offset, :], group_size, bits)
        out.offset = cache.offset
    return out


class QuantizedRowsKVCache(RowsKVCache):
    """A :class:`~.batch_kv.RowsKVCache` holding K and V quantised.

    Args:
        left_padding (list[int]): each row's left padding.
        group_size (int): elements per scale along the head dimension. Default: ``64``.
        bits (int): bits per element, 4 or 8. Default: ``8``.

    ``bits`` and ``group_size`` are what mlx-lm's attention reads to take its
    quantised path.
    """

    keys: Any  # Parts once written (mlx-lm types them as its arrays)
    values: Any

    def __init__(self, left_padding: list[int], group_size: int = 64, bits: int = 8) -> None:
        super().__init__(left_padding)
        self.group_size = group_size
        self.bits = bits

    def _blank(self, like: Parts, rows: int, length: int) -> Parts:
        import mlx.core as mx

        return _each(like, lambda p: mx.zeros((rows, p.shape[1], length, p.shape[3]), p.dtype))

    def update_and_fetch(self, keys: Any, values: Any) -> tuple[Parts, Parts]:
        """Quantise and append ``keys`` / ``values`` (shape ``(B, Hkv, N, D)``)
        at every row's end; returns the quantised K and V through the end."""
        import mlx.core as mx

        prev, n = self._idx, keys.shape[2]
        qk = quantize(keys, self.group_size, self.bits)
        qv = quantize(values, self.group_size, self.bits)
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            grow = (self.step + n - 1) // self.step * self.step
            new_k, new_v = (
                self._blank(qk, keys.shape[0], grow),
                self._blank(qv, keys.shape[0], grow),
            )
            if self.keys is None:
                self.keys, self.values = new_k, new_v
            else:
                if prev % self.step != 0:
                    self.keys = _each(self.keys, lambda p: p[..., :prev, :])
                    self.values = _each(self.values, lambda p: p[..., :prev, :])
                self.keys = tuple(
                    mx.concatenate([a, b], axis=2) for a, b in zip(self.keys, new_k, strict=True)
                )
                self.values = tuple(
                    mx.concatenate([a, b], axis=2) for a, b in zip(self.values, new_v, strict=True)
                )
        self.offset = self.offset + n
        self._idx += n
        for mine, new in ((self.keys, qk), (self.values, qv)):
            for buf, part in zip(mine, new, strict=True):
                buf[..., prev : self._idx, :] = part
        return self.keys_and_values()

    def keys_and_values(self) -> tuple[Parts, Parts]:
        """The quantised K and V of positions ``[0, size())``."""
        end = self._idx
        return _each(self.keys, lambda p: p[..., :end, :]), _each(
            self.values, lambda p: p[..., :end, :]
        )

    def finalize(self) -> None:
        """Roll right-padded rows right (``BatchKVCache.finalize`` on each part)."""
        if self._right_padding is not None:
            shift = self._right_padding[:, None]
            self.keys = _each(self.keys, lambda p: dynamic_roll(p, shift, axis=2))
            self.values = _each(self.values, lambda p: dynamic_roll(p, shift, axis=2))
            self.offset = self.offset - self._right_padding
            self.left_padding = self.left_padding + self._right_padding
            self._right_padding = None
        if self._right is not None:
            self.pads = [p + extra for p, extra in zip(self.pads, self._right, strict=True)]
            self._right = None

    def filter(self, batch_indices: Sequence[int]) -> None:
        """Keep the rows at ``batch_indices`` (:meth:`RowsKVCache.filter` on each part)."""
        import mlx.core as mx

        keep = list(batch_indices)
        index = mx.array(keep, dtype=mx.int32)
        if self.keys is not None:
            self.keys = _each(self.keys, lambda p: p[index])
            self.values = _each(self.values, lambda p: p[index])
        self.offset = self.offset[index]
        self.left_padding = self.left_padding[index]
        self.pads = [self.pads[i] for i in keep]
        shift = min(self.pads, default=0)
        if shift > 0:
            if self.keys is not None:
                self.keys = _each(self.keys, lambda p: p[..., shift:, :])
                self.values = _each(self.values, lambda p: p[..., shift:, :])
            self._idx -= shift
            self.left_padding = self.left_padding - shift
            self.pads = [p - shift for p in self.pads]

    def extend(self, other: Any) -> None:
        """Append ``other`` 's rows, both right-aligned to the longer; a
        full-precision :class:`RowsKVCache` is quantised first."""
        import mlx.core as mx

        if not isinstance(other, QuantizedRowsKVCache):
            other = to_quantized(other, self.group_size, self.bits)
        end = max(self._idx, other._idx)
        pads = [p + end - self._idx for p in self.pads]
        pads += [p + end - other._idx for p in other.pads]
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            self.pads = pads
            return
        like_k = self.keys if self.keys is not None else other.keys
        like_v = self.values if self.values is not None else other.values
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)

        def aligned(c: QuantizedRowsKVCache) -> tuple[Parts, Parts, Any, Any]:
            rows = int(c.offset.shape[0])
            k = c.keys if c.keys is not None else self._blank(like_k, rows, 0)
            v = c.values if c.values is not None else self._blank(like_v, rows, 0)
            left = end - c._idx
            right = size - k[0].shape[2] - left
            if right < 0:
                k = _each(k, lambda p: p[..., :right, :])
                v = _each(v, lambda p: p[..., :right, :])
                right = 0
            if left or right:
                width = [(0, 0), (0, 0), (left, right), (0, 0)]
                k = _each(k, lambda p: mx.pad(p, width))
                v = _each(v, lambda p: mx.pad(p, width))
            return k, v, c.offset, c.left_padding + left

        (k1, v1, o1, l1), (k2, v2, o2, l2) = aligned(self), aligned(other)
        self.keys = tuple(mx.concatenate([a, b]) for a, b in zip(k1, k2, strict=True))
        self.values = tuple(mx.concatenate([a, b]) for a, b in zip(v1, v2, strict=True))
        self.offset = mx.concatenate([o1, o2])
        self.left_padding = mx.concatenate([l1, l2])
        self._idx = end
        self.pads = pads

    def extract(self, idx: int) -> Any:
        """Row ``idx`` as mlx-lm's single-row ``QuantizedKVCache`` (a copy of its
        tokens, still quantised: the prompt cache and the SSD tier keep this form)."""
        import mlx.core as mx

        assert self.keys is not None and self.values is not None
        start, end = self.pads[idx], self._idx
        cache: Any = QuantizedKVCache(group_size=self.group_size, bits=self.bits)
        cache.keys = _each(self.keys, lambda p: mx.contiguous(p[idx : idx + 1, :, start:end]))
        cache.values = _each(self.values, lambda p: mx.contiguous(p[idx : idx + 1, :, start:end]))
        cache.offset = end - start
        return cache

    @classmethod
    def merge_quantized(
        cls, caches: Sequence[Any], group_size: int, bits: int
    ) -> QuantizedRowsKVCache:
        """One batch cache from single-row caches (``QuantizedKVCache`` s, or
        ``KVCache`` s quantised here), each row right-aligned to the longest
        (``BatchKVCache.merge``'s layout).

        Raises:
            ValueError: a row is quantised with other bits or group size.
        """
        rows = [single_row(c, group_size, bits) for c in caches]
        for c in rows:
            if (c.bits, c.group_size) != (bits, group_size) and c.keys is not None:
                raise ValueError(f"a {c.bits}-bit row cannot join a {bits}-bit batch")
        lengths = [c.offset for c in rows]
        longest = max(lengths)
        if longest == 0:
            return cls([0] * len(rows), group_size, bits)
        pads = [longest - n for n in lengths]
        like: Any = next(c for c in rows if c.keys is not None)
        out = cls(pads, group_size, bits)
        out.keys = out._blank(like.keys, len(rows), longest)
        out.values = out._blank(like.values, len(rows), longest)
        for i, (pad, c) in enumerate(zip(pads, rows, strict=True)):
            if c.keys is None:
                continue
            for mine, theirs in ((out.keys, c.keys), (out.values, c.values)):
                for buf, part in zip(mine, theirs, strict=True):
                    buf[i : i + 1, :, pad:] = part[..., : c.offset, :]
        out.offset = out.offset + longest
        out._idx = longest
        return out

    @property
    def nbytes(self) -> int:
        """Bytes of the packed values, scales and biases held (the whole buffer)."""
        if self.keys is None:
            return 0
        return sum(int(p.nbytes) for p in (*self.keys, *self.values))


def to_quantized(cache: RowsKVCache, group_size: int, bits: int) -> QuantizedRowsKVCache:
    """A full-precision batch cache quantised, rows and padding unchanged (the
    step where a batch passes ``--quantized-kv-start``).

    Args:
        cache (RowsKVCache): the batch cache (not used afterwards).
        group_size (int): elements per scale.
        bits (int): 4 or 8.

    Returns:
        QuantizedRowsKVCache: the same rows, quantised.
    """
    out = QuantizedRowsKVCache(list(cache.pads), group_size, bits)
    out.offset, out.left_padding, out._idx = cache.offset, cache.left_padding, cache._idx
    if cache.keys is not None:
        out.keys = quantize(cache.keys, group_size, bits)
        out.values = quantize(cache.values, group_size, bits)
    return out


def is_quantized(cache: Any) -> bool:
    """Whether a layer's cache holds quantised K/V (mlx-lm's test: ``bits``)."""
    return hasattr(cache, "bits")


def full_precision(cache: Any) -> bool:
    """Whether a layer's cache is one this room quantises (a plain ``KVCache``
    or :class:`~.batch_kv.RowsKVCache`)."""
    return type(cache) in (KVCache, RowsKVCache)


def _on_gpu() -> bool:
    import mlx.core as mx

    return bool(mx.default_device() == mx.gpu)


def dense_on_gpu(
    quantized_sdpa: Callable[..., Any], on_gpu: Callable[[], bool] = _on_gpu
) -> Callable[..., Any]:
    """Wrap mlx-lm's ``quantized_scaled_dot_product_attention`` so that, on a
    GPU, attention over a quantised cache dequantizes K and V and runs
    ``mx.fast.scaled_dot_product_attention``; the CPU keeps mlx-lm's path.

    Why: MLX's CUDA ``quantized_matmul`` (0.32.4) is built for linear layers'
    weights and has no kernel for attention shapes, whose "weight" is the cache
    (measured on an H100, bf16, 8-bit, group 64: "No implementation for problem
    shape" for a 511-token prefill chunk over 2047 cached tokens,
    511x2047x128x256, and for a decode step over 2049, 1x2049x128x256), so a
    quantised cache could neither prefill nor decode there. The dequantized K/V
    are the cache's own values, so the answer is the quantised cache's,
    computed in full precision; the cache still holds only the quantised bytes
    (the memory, and so the context, is what quantisation buys on a GPU; the
    per-step dequantize costs decode speed: ``benchmarks/README.md``).

    Args:
        quantized_sdpa: mlx-lm's function (same signature as the result).
        on_gpu: whether the default device is a GPU (tests force it).
    """
    import mlx.core as mx

    def attention(
        queries: Any,
        q_keys: Parts,
        q_values: Parts,
        scale: float,
        mask: Any,
        group_size: int = 64,
        bits: int = 8,
    ) -> Any:
        if not on_gpu():
            return quantized_sdpa(
                queries, q_keys, q_values, scale=scale, mask=mask, group_size=group_size, bits=bits
            )
        keys = mx.dequantize(*q_keys, group_size=group_size, bits=bits).astype(queries.dtype)
        values = mx.dequantize(*q_values, group_size=group_size, bits=bits).astype(queries.dtype)
        return mx.fast.scaled_dot_product_attention(queries, keys, values, scale=scale, mask=mask)

    attention.__wrapped__ = quantized_sdpa  # type: ignore[attr-defined]
    return attention


def attention_on_any_device() -> None:
    """Install :func:`dense_on_gpu` in ``mlx_lm.models.base`` (once),
    where its ``scaled_dot_product_attention`` looks the quantised path up by
    name; every model's attention goes through it. Idempotent."""
    from mlx_lm.models import base

    current = base.quantized_scaled_dot_product_attention
    if not hasattr(current, "__wrapped__"):
        base.quantized_scaled_dot_product_attention = dense_on_gpu(current)


"""The batched decode step's KV cache: mlx-lm's ``BatchKVCache`` with its left
padding also known on the host.

``BatchKVCache`` keeps each row's left padding in a device array, so every
``filter`` (a row leaving) and ``extract`` (a row's cache kept for the prompt
cache) reads it back with ``tolist()``: a host sync per layer, each one waiting
for the step in flight. And its ``make_mask`` builds an array mask for every
decode step, which sends mlx-cuda's attention down its masked path even when no
row is padded (one row, or rows of one length). :class:`RowsKVCache` mirrors
the padding in a Python list, updated by the same operations, so it never reads
it back, and gives a decode step no mask at all when no row is padded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mlx_lm.models.cache import BatchKVCache, KVCache


class RowsKVCache(BatchKVCache):
    """A ``BatchKVCache`` whose left padding is mirrored on the host (:attr:`pads`).

    Args:
        left_padding (list[int]): each row's left padding, as for ``BatchKVCache``.
    """

    def __init__(self, left_padding: list[int]) -> None:
        super().__init__(left_padding)
        self._starts: Any = None
        self.pads = list(left_padding)
        self._right: list[int] | None = None

    @property
    def pads(self) -> list[int]:
        """Each row's left padding (positions before its first token)."""
        return self._pads

    @pads.setter
    def pads(self, value: list[int]) -> None:
        self._pads = value
        self._starts = None

    def starts(self) -> Any:
        """:attr:`pads` as an ``int32`` array, made once per change (the
        padded-row attention reads each row's first position from it)."""
        import mlx.core as mx

        if self._starts is None:
            self._starts = mx.array(self._pads, dtype=mx.int32)
        return self._starts

    @classmethod
    def merge(cls, caches: Sequence[Any]) -> RowsKVCache:
        """One batch cache from single-row ``KVCache`` s (``BatchKVCache.merge``),
        each row right-aligned to the longest."""
        if max(c.size() for c in caches) == 0:
            return cls([0] * len(caches))
        return super().merge(caches)

    def prepare(self, *, left_padding=None, lengths=None, right_padding=None) -> None:
        super().prepare(left_padding=left_padding, lengths=lengths, right_padding=right_padding)
        if left_padding is not None:
            self.pads = [p + extra for p, extra in zip(self.pads, left_padding, strict=True)]
        if right_padding is not None and max(right_padding) > 0:
            self._right = list(right_padding)

    def finalize(self) -> None:
        super().finalize()
        if self._right is not None:
            self.pads = [p + extra for p, extra in zip(self.pads, self._right, strict=True)]
            self._right = None

    def filter(self, batch_indices: Sequence[int]) -> None:
        """Keep the rows at ``batch_indices`` (``BatchKVCache.filter`` without
        reading the padding back)."""
        import mlx.core as mx

        keep = list(batch_indices)
        index = mx.array(keep, dtype=mx.int32)
        if self.keys is not None:
            self.keys = self.keys[index]
            self.values = self.values[index]
        self.offset = self.offset[index]
        self.left_padding = self.left_padding[index]
        self.pads = [self.pads[i] for i in keep]
        shift = min(self.pads, default=0)
        if shift > 0:  # drop the columns every row pads
            if self.keys is not None:
                self.keys = self.keys[..., shift:, :]
                self.values = self.values[..., shift:, :]
            self._idx -= shift
            self.left_padding = self.left_padding - shift
            self.pads = [p - shift for p in self.pads]

    def extend(self, other: Any) -> None:
        """Append ``other`` 's rows (a :class:`RowsKVCache`), both right-aligned
        to the longer (``BatchKVCache.extend``)."""
        end = max(self._idx, other._idx)
        pads = [p + end - self._idx for p in self.pads]
        pads += [p + end - other._idx for p in other.pads]
        super().extend(other)
        self.pads = pads

    def extract(self, idx: int) -> KVCache:
        """Row ``idx`` as a single-row ``KVCache`` (a copy of its tokens)."""
        import mlx.core as mx

        assert self.keys is not None and self.values is not None
        cache = KVCache()
        start = self.pads[idx]
        cache.keys = mx.contiguous(self.keys[idx : idx + 1, :, start : self._idx])
        cache.values = mx.contiguous(self.values[idx : idx + 1, :, start : self._idx])
        cache.offset = cache.keys.shape[2]
        return cache

    def rewind(self, counts: Sequence[int]) -> None:
        """Drop the last ``counts[i]`` positions of row ``i`` (a speculative
        verify step's rejected drafts), keeping every row right-aligned.

        The positions every row drops go as ``trim`` drops them (the end moves
        back); a row dropping ``d`` more than the fewest is rolled ``d``
        columns right, its left padding growing by ``d`` (mlx-lm's
        ``finalize`` roll of right-padded prefill rows), so the mask and each
        row's RoPE offset stay those of its kept tokens.

        Args:
            counts (Sequence[int]): per row, positions to drop (``>= 0``).
        """
        least = min(counts, default=0)
        if least > 0:
            self.trim(least)
        extra = [c - least for c in counts]
        if any(extra):
            self.prepare(right_padding=extra)
            self.finalize()

    def make_mask(self, N: int, return_array: bool = False, **kwargs: Any) -> Any:  # noqa: N803
        """No mask for a one-token step when no row is padded (each row then
        sees every cached position, as an unbatched decode step does); else
        ``BatchKVCache`` 's mask."""
        if N == 1 and not return_array and kwargs.get("window_size") is None:
            if not any(self.pads):
                return None
        return super().make_mask(N, return_array=return_array, **kwargs)


def merge_layer(layer: Sequence[Any]) -> Any:
    """One layer's batch cache from its per-row caches: plain ``KVCache`` s
    become a :class:`RowsKVCache`; other kinds use their own mlx-lm ``merge``
    (rotating, recurrent and other batchable caches).

    Raises:
        ValueError: the layer's cache kind cannot be batched (mlx-lm's rule).
    """
    if all(type(c) is KVCache for c in layer):
        return RowsKVCache.merge(layer)
    if hasattr(layer[0], "merge"):
        return layer[0].merge(list(layer))
    raise ValueError(f"{type(layer[0]).__name__} does not support batching")


def merge_rows(caches: Sequence[list[Any]]) -> list[Any]:
    """One batch cache per layer from per-row caches (``make_prompt_cache``
    lists), each layer by :func:`merge_layer`; quantised layers go through
    :meth:`~.kv_scheme.KvScheme.merge` instead.

    Args:
        caches (Sequence[list]): per row, its per-layer caches (all rows alike).

    Returns:
        list: per layer, the batch cache.

    Raises:
        ValueError: a layer's cache kind cannot be batched (mlx-lm's rule).
    """
    return [merge_layer(layer) for layer in zip(*caches, strict=True)]

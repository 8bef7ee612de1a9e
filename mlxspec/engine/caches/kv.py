"""KV cache helpers shared by the prompt cache, the lanes and the SSD tier.

Functions over mlx-lm per-layer KV cache lists (``make_prompt_cache``) and
token sequences; engine thread only where they touch MLX arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Longest uncached tail that :func:`bucket_tail` rounds up.
MAX_TAIL_BUCKET = 512
#: Tails up to this length round up to a power of two, longer ones to a
#: multiple of it (see :func:`bucket_tail`).
TAIL_STEP = 64


def tail_buckets() -> tuple[int, ...]:
    """Every prefill length :func:`bucket_tail` rounds an uncached tail to.

    Powers of two up to :data:`TAIL_STEP`, then multiples of it up to
    :data:`MAX_TAIL_BUCKET`: ``(1, 2, 4, ..., 64, 128, 192, ..., 512)``, 14
    lengths. The start-up warm-up (:mod:`.warmup`) runs each once.

    Returns:
        tuple[int, ...]: the lengths in tokens, ascending.
    """
    powers = tuple(1 << i for i in range(TAIL_STEP.bit_length()) if 1 << i <= TAIL_STEP)
    return powers + tuple(range(2 * TAIL_STEP, MAX_TAIL_BUCKET + 1, TAIL_STEP))


def bucket_tail(usable: int, prompt_tokens: int) -> int:
    """Move a hit's boundary back so the prefill after it has one of a few lengths.

    Both lanes prefill the uncached tail but its last token (that one runs as
    the first decode step), so the prefill is ``prompt_tokens - usable - 1``
    tokens. On mlx-cuda a forward pass on a token count not seen before plans
    its matrix products first: on the H200 (7.4B, 1024 cached tokens) the
    first pass of a new length took 50-90 ms against 10-20 ms for a repeat,
    and a repeated length over a new cache length 12-18 ms with
    ``MLX_CUDA_USE_CUDNN_SDPA=0`` (cuDNN's attention plans per query *and*
    key length, ~50 ms each, so there only its graph cache helps). Rounding
    the tail up to 1, 2, 4 ... :data:`TAIL_STEP` tokens, then to a multiple of
    it up to :data:`MAX_TAIL_BUCKET` (:func:`tail_buckets`), keeps that set to
    14 lengths, which the engine runs once at start-up (:mod:`.warmup`), at the price
    of re-running at most ``TAIL_STEP - 1`` tokens more than the tail had
    (plain powers of two re-ran up to half the tail: a 149-token tail became
    256, leaving 21 of 128 cached tokens, too few to use, on the H200).

    Args:
        usable (int): cached tokens the hit would serve.
        prompt_tokens (int): the prompt's length.

    Returns:
        int: the cached tokens to use (``<= usable``; ``0`` for none).
    """
    prefill = prompt_tokens - usable - 1
    if prefill <= 0 or prefill > MAX_TAIL_BUCKET:
        return usable
    if prefill <= TAIL_STEP:
        bucket = 1 << (prefill - 1).bit_length()
    else:
        bucket = -(-prefill // TAIL_STEP) * TAIL_STEP
    return max(prompt_tokens - 1 - bucket, 0)


def cache_length(cache: list[Any]) -> int | None:
    """Tokens held by a per-layer KV cache list, or ``None`` if it cannot tell
    (recurrent layers keep state, not positions)."""
    offsets = {getattr(c, "offset", None) for c in cache}
    if len(offsets) != 1:
        return None
    (offset,) = offsets
    return None if offset is None else int(offset)


def compact(cache: list[Any], wait: bool) -> None:
    """Shrink KV buffers to the tokens they hold, so kept entries waste no step
    padding, and schedule their evaluation (engine thread).

    ``wait=False`` queues the copy with ``mx.async_eval`` instead of blocking:
    in the serial lane ``generate_step`` has the next decode step in flight
    when a request ends, and ``mx.eval`` here waited for it (a whole decode
    step, ~0.2 s on the embedded model on this CPU) before the request's
    ``Finished`` went out. ``wait=True`` is for the SSD writer thread, which
    only serializes finished arrays (it runs no MLX computation).
    """
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache, QuantizedKVCache

    for c in cache:
        if type(c) is KVCache and c.keys is not None and c.offset < c.keys.shape[2]:
            c.keys = mx.contiguous(c.keys[..., : c.offset, :])
            c.values = mx.contiguous(c.values[..., : c.offset, :])
        elif type(c) is QuantizedKVCache and c.keys is not None and c.offset < c.keys[0].shape[2]:
            end = c.offset  # each of (packed, scales, biases) to the tokens held
            c.keys = tuple(mx.contiguous(p[..., :end, :]) for p in c.keys)
            c.values = tuple(mx.contiguous(p[..., :end, :]) for p in c.values)
    state = [c.state for c in cache]
    if wait:
        mx.eval(state)
    else:
        mx.async_eval(state)


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n

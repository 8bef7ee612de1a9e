"""Start-up warm-up: one forward pass per prefill length a prompt-cache hit can take.

On mlx-cuda a forward pass on a token count not seen before plans its matrix
products first: on an H200 a 7.4B model's first pass of a new length took
50-90 ms against 10-20 ms for a repeat (``benchmarks/README.md``, "Profiled
(2026-11-30 ..."). A prompt-cache hit prefills only the uncached tail, which a
GPU rounds to one of the :func:`~.kv.tail_buckets` lengths
(:func:`~.kv.bucket_tail`), so later turns of a conversation reach their
target TTFT only once their bucket was seen. Running each bucket once before
the first request moves that planning to start-up.

What is warmed: the matrix-product plans per token count. cuDNN's attention
plans per query *and* key length, so a prefill over a longer cache may still
meet a new attention shape; the warm-up does not try to cover those.

Engine thread only: the engine runs :func:`warm_up_engine` on its own thread
before it takes the first job, so requests wait in its queue meanwhile and the
HTTP routes that do not touch the engine (``/health``) answer as usual.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from .kv import tail_buckets

log = logging.getLogger("mlxspec.engine")


def warmup_lengths(context_window: int, prefill_step: int) -> tuple[int, ...]:
    """The prefill lengths the warm-up runs.

    The tail buckets (:func:`~.kv.tail_buckets`) plus ``prefill_step``, the
    chunk every long prompt is prefilled in, keeping only lengths a prefill can
    have in this model's window: a prefill leaves at least the prompt's last
    token to the first decode step, so it is at most ``context_window - 1``
    tokens (positions past the window may not even be valid for the model).

    Args:
        context_window (int): the model's prompt + completion limit, tokens.
        prefill_step (int): prompt tokens per prefill chunk of the lanes.

    Returns:
        tuple[int, ...]: distinct lengths in tokens, ascending.
    """
    lengths = {*tail_buckets(), prefill_step}
    return tuple(sorted(n for n in lengths if 1 <= n < context_window))


def warm_up(model: Any, lengths: Sequence[int]) -> None:
    """Run one prefill per length, then one decode step (engine thread).

    Each prefill is a token-id batch of shape ``(1, L)`` (zeros, ``uint32``)
    on a fresh mlx-lm KV cache (``make_prompt_cache``), evaluated as the lanes
    evaluate a prefill chunk (the cache state only, as ``generate_step`` does).
    The decode step feeds one token on the last length's cache and evaluates
    the last position's log-probabilities and their argmax, as
    ``generate_step``'s ``_step`` does. Everything runs on mlx-lm's
    ``generation_stream`` and is freed afterwards (``mx.clear_cache``). No
    prompt cache, random state or request is touched, so the lanes produce
    exactly what they would without it.

    Args:
        model: the mlx-lm model (called as ``model(tokens, cache=cache)``).
        lengths (Sequence[int]): prefill lengths in tokens, each >= 1.
    """
    import mlx.core as mx

    try:
        _run_passes(model, lengths)
    finally:  # the passes' arrays are gone by now: return their buffers
        mx.clear_cache()


def _run_passes(model: Any, lengths: Sequence[int]) -> None:
    import mlx.core as mx
    from mlx_lm.generate import generation_stream
    from mlx_lm.models.cache import make_prompt_cache

    with mx.stream(generation_stream):
        cache: list[Any] = []
        for length in lengths:
            cache = make_prompt_cache(model)
            model(mx.zeros((1, length), dtype=mx.uint32), cache=cache)
            mx.eval([c.state for c in cache])
        if cache:
            logits = model(mx.zeros((1, 1), dtype=mx.uint32), cache=cache)[:, -1, :]
            logprobs = logits - mx.logsumexp(logits, keepdims=True)
            mx.eval(mx.argmax(logprobs, axis=-1), logprobs)


def warm_up_engine(model: Any, context_window: int, prefill_step: int) -> None:
    """Warm the prefill lengths of :func:`warmup_lengths` and log the time it took.

    A failure is logged and swallowed: the warm-up only saves later requests
    time, so the engine serves without it rather than not at all.

    Args:
        model: the mlx-lm model.
        context_window (int): the model's prompt + completion limit, tokens.
        prefill_step (int): prompt tokens per prefill chunk of the lanes.
    """
    lengths = warmup_lengths(context_window, prefill_step)
    start = time.perf_counter()
    try:
        warm_up(model, lengths)
    except Exception:
        log.exception("warm-up failed; serving without it")
        return
    log.info(
        "warm-up: %d prefill lengths (%s tokens) and a decode step in %.2f s",
        len(lengths),
        ", ".join(map(str, lengths)),
        time.perf_counter() - start,
    )

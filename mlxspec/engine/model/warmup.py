"""Start-up warm-up: one forward pass per prefill length a prompt-cache hit can
take, and one decode step per batch size the batched lane can run.

On mlx-cuda a forward pass on a token count not seen before plans its matrix
products first: on an H200 a 7.4B model's first pass of a new length took
50-90 ms against 10-20 ms for a repeat (``benchmarks/README.md``, "Profiled
(2026-11-30 ..."). A prompt-cache hit prefills only the uncached tail, which a
GPU rounds to one of the :func:`~.kv.tail_buckets` lengths
(:func:`~.kv.bucket_tail`), so later turns of a conversation reach their
target TTFT only once their bucket was seen. Running each bucket once before
the first request moves that planning to start-up. The batched lane decodes
``(rows, 1)`` token batches on a left-padded batch KV cache; the first step at
each new row count planned again in the first bursts of an H200 run (TTFT of the
first 8-client burst 145-364 ms against 60-110 ms later, ``benchmarks/README.md``),
so each row count up to ``--batch`` gets one decode step too.

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

from mlxspec.engine.caches.kv import tail_buckets

log = logging.getLogger("mlxspec.engine")

#: Tokens in each row of the batched warm-up steps' cache.
BATCH_ROW_TOKENS = 16


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


def warm_up(model: Any, lengths: Sequence[int], max_rows: int = 1) -> None:
    """Run one prefill per length, then one decode step per row count (engine thread).

    Each prefill is a token-id batch of shape ``(1, L)`` (zeros, ``uint32``)
    on a fresh mlx-lm KV cache (``make_prompt_cache``), evaluated as the lanes
    evaluate a prefill chunk (the cache state only, as ``generate_step`` does).
    The decode step feeds one token on the last length's cache and evaluates
    the last position's log-probabilities and their argmax, as
    ``generate_step``'s ``_step`` does. Then, for each row count ``B`` from 2
    to ``max_rows``, a ``(B, 1)`` decode step runs on the batch cache the
    batched lane builds from ``B`` rows (:func:`~..caches.batch_kv.merge_rows`
    of ``B`` copies of a 16-token cache: short, so the warm-up's memory stays
    small). Everything runs on mlx-lm's ``generation_stream`` and is freed
    afterwards (``mx.clear_cache``). No prompt cache, random state or request
    is touched, so the lanes produce exactly what they would without it.

    Args:
        model: the mlx-lm model (called as ``model(tokens, cache=cache)``).
        lengths (Sequence[int]): prefill lengths in tokens, each >= 1.
        max_rows (int): the most rows the batched lane decodes at once
            (``--batch``); 1 warms no batched step. Default: ``1``.
    """
    import mlx.core as mx
    from mlx_lm.generate import generation_stream

    try:
        with mx.stream(generation_stream):
            _run_passes(model, lengths)
            _run_batched_steps(model, max_rows)
    finally:  # the passes' arrays are gone by now: return their buffers
        mx.clear_cache()


def _decode_step(model: Any, rows: int, cache: list[Any]) -> None:
    import mlx.core as mx

    logits = model(mx.zeros((rows, 1), dtype=mx.uint32), cache=cache)[:, -1, :]
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    mx.eval(mx.argmax(logprobs, axis=-1), logprobs)


def _run_passes(model: Any, lengths: Sequence[int]) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache: list[Any] = []
    for length in lengths:
        cache = make_prompt_cache(model)
        model(mx.zeros((1, length), dtype=mx.uint32), cache=cache)
        mx.eval([c.state for c in cache])
    if cache:
        _decode_step(model, 1, cache)


def _run_batched_steps(model: Any, max_rows: int) -> None:
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    if max_rows < 2:
        return
    row = make_prompt_cache(model)
    model(mx.zeros((1, BATCH_ROW_TOKENS), dtype=mx.uint32), cache=row)
    mx.eval([c.state for c in row])
    from mlxspec.engine.caches.batch_kv import merge_rows

    for rows in range(2, max_rows + 1):
        _decode_step(model, rows, merge_rows([row] * rows))


def warm_up_engine(model: Any, context_window: int, prefill_step: int, max_rows: int = 1) -> None:
    """Warm the prefill lengths of :func:`warmup_lengths` and the decode steps of
    1 to ``max_rows`` rows, and log the time it took.

    A failure is logged and swallowed: the warm-up only saves later requests
    time, so the engine serves without it rather than not at all.

    Args:
        model: the mlx-lm model.
        context_window (int): the model's prompt + completion limit, tokens.
        prefill_step (int): prompt tokens per prefill chunk of the lanes.
        max_rows (int): the batched lane's row cap (``--batch``). Default: ``1``.
    """
    lengths = warmup_lengths(context_window, prefill_step)
    start = time.perf_counter()
    try:
        warm_up(model, lengths, max_rows)
    except Exception:
        log.exception("warm-up failed; serving without it")
        return
    log.info(
        "warm-up: %d prefill lengths (%s tokens) and decode steps of 1 to %d rows in %.2f s",
        len(lengths),
        ", ".join(map(str, lengths)),
        max_rows,
        time.perf_counter() - start,
    )

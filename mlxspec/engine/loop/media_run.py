"""A request with media, run alone to its end on mlx-vlm's ``generate_step``.

The vision wing's model (:mod:`~mlxspec.engine.model.vision`) embeds the
prompt with its towers' features (``get_input_embeddings``) and decodes with
mlx-vlm's own loop, the one ``mlx_vlm.generate`` runs, with the request's
sampler and logits processors, so a greedy answer is token for token
``mlx_vlm.generate``'s. It runs on the serial lane (``usage.lane: "serial"``):
the batch waits while it runs, as the reference runs audio requests. The
vision tower's output is kept by the media's content hash (the wing's encoder
cache), so a later turn about the same image skips the tower. Its KV
cache is neither taken from nor kept in the prompt cache: token ids alone do
not say which image they stood for (reference, ``/stats`` object counters).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mlxspec.engine.loop.lanes import LaneParts, StepTimes
from mlxspec.engine.loop.rows import Row
from mlxspec.engine.sampling.sampler import build_logits_processors, build_sampler

if TYPE_CHECKING:
    from mlxspec.engine.loop.handles import RequestHandle

__all__ = ["run_media_alone"]


def _inputs(arrays: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    """The pixel values, attention mask and other processor outputs as MLX arrays."""
    import mlx.core as mx

    made = {key: mx.array(value) for key, value in arrays.items()}
    return made.pop("pixel_values", None), made.pop("attention_mask", None), made


def run_media_alone(
    handle: RequestHandle,
    parts: LaneParts,
    budget: int,
    times: StepTimes | None = None,
    between: Callable[[], None] | None = None,
) -> str:
    """Run a request with media to its end on the vision wing.

    Args:
        handle (RequestHandle): the request (``request.media`` set).
        parts (LaneParts): the engine's parts (``parts.vision`` set).
        budget (int): tokens it may generate (>= 1).
        times (StepTimes | None): where its decode steps are timed. Default: ``None``.
        between (Callable | None): called after each token (the scheduler drops
            requests cancelled while they wait). Default: ``None``.

    Returns:
        str: ``"completed"`` or ``"cancelled"``.

    Raises:
        Exception: whatever the model raised; the request fails alone.
    """
    import mlx.core as mx
    from mlx_vlm.generate.ar import generate_step

    req = handle.request
    assert req.media is not None and parts.vision is not None
    grammar = None if parts.grammars is None else parts.grammars.for_request(req.constraint)
    row = Row(handle, parts.tokenizer, parts.eos, lane="serial", cached=0, grammar=grammar)
    if req.sampling.seed is not None:
        mx.random.seed(req.sampling.seed)
    processors = build_logits_processors(req.logits)
    if grammar is not None:
        processors = [*processors, grammar]
    pixel_values, mask, extra = _inputs(dict(req.media.arrays))
    features = parts.vision.image_features(pixel_values, extra, req.media.digest)
    if features is not None:  # the tower ran once for these pixels (encoder-output cache)
        extra["cached_image_features"] = features
    steps = generate_step(
        mx.array([list(req.prompt)], dtype=mx.int32),
        parts.vision.model,
        pixel_values,
        mask,
        max_tokens=budget,
        sampler=build_sampler(req.sampling, list(parts.xtc_special)),
        logits_processors=processors,
        **extra,
    )
    times = times if times is not None else StepTimes()
    try:
        while True:
            if handle.cancelled:
                return "cancelled"
            start = time.perf_counter()
            token, logprobs = next(steps)
            stepped = time.perf_counter()
            ended = row.push(int(token), logprobs)
            if not ended and row.count >= budget:
                row.finish_length()
                ended = True
            times.add(1, stepped - start, time.perf_counter() - stepped)
            if ended:
                return "completed"
            if between is not None:
                between()
    finally:
        steps.close()  # on this thread: its MLX stream context is this thread's

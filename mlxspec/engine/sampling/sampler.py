"""Sampling: mlx-lm's sampler and logits processors built from request params,
plus the model author's defaults from ``generation_config.json``."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxspec.engine.types import LogitsParams, SamplingParams


@dataclass(frozen=True)
class GenerationDefaults:
    """Sampling defaults used when a request omits a field.

    Precedence (reference, "POST /v1/chat/completions"): request value, then
    the server's CLI flag, then the model's ``generation_config.json``, then
    mlx_lm.server's built-in default.

    Args:
        temperature (float | None): Default: ``None`` (mlx-lm's 0.0, greedy).
        top_p (float | None): Default: ``None`` (off).
        top_k (int | None): Default: ``None`` (off).
        max_tokens (int | None): server cap when a request sets none;
            ``None`` means until EOS or the context window is full.
        min_p (float | None): Default: ``None`` (off).
        template_kwargs (Mapping | None): chat template variables a request's
            ``chat_template_kwargs`` are merged over (mlx_lm.server's
            ``--chat-template-args``, and ``--thinking``'s ``enable_thinking``).
            Default: ``None``.
    """

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    min_p: float | None = None
    template_kwargs: Mapping[str, Any] | None = field(default=None, hash=False)

    def merged(self, **overrides: Any) -> GenerationDefaults:
        """Return a copy where every non-``None`` override replaces the field."""
        fields = {k: v for k, v in overrides.items() if v is not None}
        return GenerationDefaults(**{**self.__dict__, **fields})


def read_generation_config(model_path: Path) -> GenerationDefaults:
    """Read sampling defaults from ``<model_path>/generation_config.json``.

    ``do_sample: false`` means greedy (Hugging Face ``GenerationConfig`` rule),
    so it sets temperature 0 regardless of ``temperature``.

    Args:
        model_path (Path): an MLX model folder.

    Returns:
        GenerationDefaults: the file's temperature/top_p/top_k; all ``None``
        when the file is absent or unreadable.
    """
    try:
        cfg = json.loads((model_path / "generation_config.json").read_text())
    except (OSError, ValueError):
        return GenerationDefaults()
    if not isinstance(cfg, dict):
        return GenerationDefaults()
    temperature = cfg.get("temperature")
    if cfg.get("do_sample") is False:
        temperature = 0.0
    top_k = cfg.get("top_k")
    return GenerationDefaults(
        temperature=_number(temperature),
        top_p=_number(cfg.get("top_p")),
        top_k=top_k if isinstance(top_k, int) and not isinstance(top_k, bool) else None,
    )


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


#: Temperatures below this sample greedily (vLLM's ``_SAMPLING_EPS``): mlx-lm
#: scales logits by ``1 / temperature`` in float32, which overflows to infinity
#: (NaN probabilities, random tokens) for temperatures under ~3e-39.
GREEDY_BELOW = 1e-5

#: Temperatures above this sample as this one does: uniformly over the tokens
#: the filters keep (1e30 makes every finite logit's scaled value vanish next
#: to 1). Beyond ~1e45, ``1 / temperature`` rounds to 0 in float32 and masked
#: ``-inf`` logits become NaN (every draw the same token).
MAX_TEMPERATURE = 1e30

#: Positive ``top_p`` values below this act as this one does: only the most
#: likely token survives (its probability is at least 1 / vocab, above 1e-7
#: for any vocabulary under 10M tokens). Below ~1e-45 ``top_p * mass``
#: rounds to 0 in float32 and mlx-lm's ``apply_top_p`` drops every token.
MIN_TOP_P = 1e-7


def build_sampler(params: SamplingParams, special_tokens: list[int]) -> Callable:
    """Build the sampler with ``mlx_lm.sample_utils.make_sampler``.

    A temperature under :data:`GREEDY_BELOW` is greedy (argmax), as 0 is; one
    above :data:`MAX_TEMPERATURE` and a positive ``top_p`` under
    :data:`MIN_TOP_P` are moved to those bounds, which sample the same way
    without float32 underflow.

    A request with a ``seed`` (and a temperature) gets a :class:`SeededSampler`
    of its own, whose draws come from a request-local random stream, so it can
    decode in the batch; with XTC as well it keeps mlx-lm's sampler, whose XTC
    coin comes from MLX's global stream (:func:`needs_global_seed`).

    Requests with the same settings get the same sampler object unless they use
    XTC or a seed (mlx-lm's ``BatchGenerator`` samples rows that share one
    sampler in one call; the batched lane, :mod:`~.batch_sampler`, samples
    every row in one call from the settings themselves). XTC draws one "apply
    or not" number per call, so a shared XTC sampler would make that choice for
    the whole batch at once: those samplers stay per request.

    Args:
        params (SamplingParams): request sampling settings.
        special_tokens (list[int]): tokens XTC never removes (newline and EOS,
            as ``mlx_lm.server._make_sampler`` passes).

    Returns:
        Callable: ``logprobs (rows, vocab) float -> token ids (rows,) uint32``.
    """
    settings = (*sampler_settings(params), tuple(special_tokens))
    if params.seed is not None and settings[0] > 0 and params.xtc_probability == 0:
        return SeededSampler(params.seed, *settings[:4])
    if params.xtc_probability > 0:
        return _make_sampler(*settings)
    return _shared_sampler(*settings)


def sampler_settings(params: SamplingParams) -> tuple[float, float, float, int, float, float]:
    """The settings a request samples with, after :func:`build_sampler`'s bounds.

    A temperature under :data:`GREEDY_BELOW` becomes 0 (greedy), one above
    :data:`MAX_TEMPERATURE` that bound, and a positive ``top_p`` under
    :data:`MIN_TOP_P` that bound; the batched sampler
    (:mod:`~.batch_sampler`) vectorises exactly these values.

    Returns:
        tuple: ``(temperature, top_p, min_p, top_k, xtc_probability, xtc_threshold)``.
    """
    temperature = params.temperature if params.temperature >= GREEDY_BELOW else 0.0
    top_p = max(params.top_p, MIN_TOP_P) if params.top_p > 0 else params.top_p
    return (
        min(temperature, MAX_TEMPERATURE),
        top_p,
        params.min_p,
        params.top_k,
        params.xtc_probability,
        params.xtc_threshold,
    )


def needs_global_seed(params: SamplingParams) -> bool:
    """Whether a request must seed MLX's global random stream and decode alone
    on the serial lane: a seeded, sampled request using XTC (mlx-lm's
    ``apply_xtc`` draws its coin from the global stream). Any other seeded
    request samples with a :class:`SeededSampler` and may share the batch."""
    return (
        params.seed is not None
        and params.temperature >= GREEDY_BELOW
        and params.xtc_probability > 0
    )


class SeededSampler:
    """A sampler drawing from its own random stream, seeded by the request.

    The reference: "An explicit ``seed`` controls a request-local random stream
    and can use continuous execution. Repeating a request reproduces sampling
    at the same model arithmetic and batch composition." The filters are
    mlx-lm's (``apply_top_p``, ``apply_min_p``, ``apply_top_k``, in
    ``make_sampler``'s order) and the draw is ``mx.random.categorical`` of the
    logits over the temperature, as mlx-lm's ``categorical_sampling``, but
    with a key split off this sampler's own key at each call instead of MLX's
    global one. One object per request (it holds the stream's state); a
    request moved from the lone lane into the batch keeps it.

    Args:
        seed (int): the request's seed, ``0 <= seed < 2**64``.
        temperature (float): softmax temperature, > 0.
        top_p (float): nucleus mass; ``0`` or ``>= 1`` is off.
        min_p (float): min-p threshold; ``0`` is off.
        top_k (int): keep the k most likely tokens; ``0`` is off.

    Call: ``logprobs (rows, vocab) float -> token ids (rows,) uint32``.
    """

    def __init__(self, seed: int, temperature: float, top_p: float, min_p: float, top_k: int):
        import mlx.core as mx
        from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

        self._key = mx.random.key(seed)
        self._scale = 1.0 / temperature
        self._filters: list[Callable] = []
        if 0 < top_p < 1.0:
            self._filters.append(lambda x: apply_top_p(x, top_p))
        if min_p != 0.0:
            self._filters.append(lambda x: apply_min_p(x, min_p, 1))
        if top_k > 0:
            self._filters.append(lambda x: apply_top_k(x, top_k))

    def __call__(self, logprobs: Any) -> Any:
        import mlx.core as mx

        self._key, draw = mx.random.split(self._key)
        for keep in self._filters:
            logprobs = keep(logprobs)
        return mx.random.categorical(logprobs * self._scale, key=draw)


def _make_sampler(
    temperature: float,
    top_p: float,
    min_p: float,
    top_k: int,
    xtc_probability: float,
    xtc_threshold: float,
    special_tokens: tuple[int, ...],
) -> Callable:
    from mlx_lm.sample_utils import make_sampler

    return make_sampler(
        temperature,
        top_p=top_p,
        min_p=min_p,
        top_k=top_k,
        xtc_probability=xtc_probability,
        xtc_threshold=xtc_threshold,
        xtc_special_tokens=list(special_tokens),
    )


#: One sampler per distinct setting (see :func:`build_sampler`); the settings are
#: request values, so the cache is bounded.
_shared_sampler = functools.lru_cache(maxsize=256)(_make_sampler)


def build_logits_processors(params: LogitsParams) -> list[Callable]:
    """Build logits processors with ``mlx_lm.sample_utils.make_logits_processors``.

    Returns:
        list[Callable]: each maps ``(tokens, logits (1, vocab)) -> logits``.
    """
    from mlx_lm.sample_utils import make_logits_processors

    return make_logits_processors(
        dict(params.logit_bias) or None,
        params.repetition_penalty,
        params.repetition_context_size,
        params.presence_penalty,
        params.presence_context_size,
        params.frequency_penalty,
        params.frequency_context_size,
    )


def with_history(processors: list[Any], history: Sequence[int], window: int) -> list[Any]:
    """Logits processors that also see the cached prompt tokens.

    ``generate_step`` passes its processors only the tokens it prefilled, so
    after a cache hit the penalties would miss the cached prefix; this prepends
    the last ``window`` cached tokens to what each processor sees, keeping
    penalised outputs identical with and without the cache.

    Args:
        processors (list): ``(tokens, logits) -> logits`` callables.
        history (Sequence[int]): the cached prompt tokens.
        window (int): the most tokens any processor looks back over.

    Returns:
        list: wrapped processors (``processors`` itself when there is no history).
    """
    import mlx.core as mx

    if not processors or not history or window <= 0:
        return processors
    past = mx.array(list(history[-window:]), dtype=mx.uint32)

    def wrap(processor: Any) -> Any:
        return lambda tokens, logits: processor(
            mx.concatenate([past, tokens.astype(mx.uint32)]), logits
        )

    return [wrap(p) for p in processors]


def penalty_window(params: LogitsParams) -> int:
    """How many recent tokens the request's penalties look at (0 when none is on),
    as mlx-lm's ``make_logits_processors`` slices its context."""
    sizes = [
        size
        for penalty, size in (
            (params.repetition_penalty, params.repetition_context_size),
            (params.presence_penalty, params.presence_context_size),
            (params.frequency_penalty, params.frequency_context_size),
        )
        if penalty
    ]
    return max(sizes, default=0)

"""Sampling every row of a decode batch in one call, each with its own settings.

mlx-lm's ``BatchGenerator`` samples a batch in one call only when all its rows
share one sampler object; otherwise it calls each row's sampler on its
``(1, vocab)`` slice and concatenates them, a few graph nodes per row and step.
:class:`BatchSampler` keeps each row's settings (temperature, top-p, min-p,
top-k, as :func:`~.sampler.sampler_settings` bounds them) in per-row arrays and
applies mlx-lm's filters (``apply_top_p``, ``apply_min_p``, ``apply_top_k``,
in ``make_sampler``'s order) to the whole ``(rows, vocab)`` matrix, with one
``mx.random.categorical`` draw for every sampled row and one ``argmax`` for
the greedy ones. Rows whose sampler cannot be vectorised keep it and are
sampled on their own slice: a :class:`~.sampler.SeededSampler` (its own
random stream, which the request's reproducibility rests on) and XTC (one coin
per call from MLX's global stream).

:func:`logprob_rows` picks, in the same graph, the sampled token's
log-probability and the top candidates of the rows that asked for them, so the
step's one host read returns them with the tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mlxspec.engine.sampling.sampler import SeededSampler, sampler_settings
from mlxspec.engine.types import SamplingParams


@dataclass(frozen=True)
class RowSampling:
    """How one row samples.

    Args:
        temperature (float): 0 is greedy.
        top_p (float): nucleus mass; off unless ``0 < top_p < 1``.
        min_p (float): 0 is off.
        top_k (int): 0 is off.
        custom (Callable | None): a sampler called on the row's own
            ``(1, vocab)`` log-probabilities instead (seeded or XTC rows).
            Default: ``None``.
    """

    temperature: float
    top_p: float
    min_p: float
    top_k: int
    custom: Callable | None = None

    @classmethod
    def of(cls, params: SamplingParams, sampler: Callable) -> RowSampling:
        """The row's settings from its request's ``params`` and the sampler
        :func:`~.sampler.build_sampler` gave it (kept when it cannot be
        vectorised: a :class:`~.sampler.SeededSampler`, or XTC)."""
        temperature, top_p, min_p, top_k, xtc, _ = sampler_settings(params)
        custom = isinstance(sampler, SeededSampler) or (temperature > 0 and xtc > 0)
        return cls(temperature, top_p, min_p, top_k, sampler if custom else None)


class BatchSampler:
    """Samples a ``(rows, vocab)`` log-probability matrix, a row per request.

    Rows are added and dropped with the batch (:meth:`extend`, :meth:`filter`);
    the per-row arrays are rebuilt only when the rows change.
    """

    def __init__(self) -> None:
        self._rows: list[RowSampling] = []
        self._plan: _Plan | None = None

    def __len__(self) -> int:
        return len(self._rows)

    def extend(self, rows: Sequence[RowSampling]) -> None:
        """Append ``rows`` at the end of the batch."""
        self._rows.extend(rows)
        self._plan = None

    def filter(self, keep: Sequence[int]) -> None:
        """Keep only the rows at positions ``keep``, in that order."""
        self._rows = [self._rows[i] for i in keep]
        self._plan = None

    def __call__(self, logprobs: Any) -> Any:
        """Sample one token per row.

        Args:
            logprobs (mx.array): shape ``(rows, vocab)``, log-softmax of the
                processed logits (as mlx-lm's samplers take them).

        Returns:
            mx.array: shape ``(rows,)``, ``uint32`` token ids.
        """
        import mlx.core as mx

        if self._plan is None:
            self._plan = _Plan.of(self._rows)
        plan = self._plan
        tokens = mx.argmax(logprobs, axis=-1).astype(mx.uint32)
        if plan.sampled is not None:
            drawn = _draw(logprobs, plan)
            tokens = mx.where(plan.sampled, drawn, tokens)
        if plan.custom:
            rows = mx.array([i for i, _ in plan.custom])
            own = [fn(logprobs[i : i + 1]).astype(mx.uint32) for i, fn in plan.custom]
            tokens[rows] = mx.concatenate(own)
        return tokens

    def scaled(self, logprobs: Any) -> tuple[Any, Any]:
        """What each drawn row samples from, at every position of a
        multi-token step (a speculative verify step scores several).

        Args:
            logprobs (mx.array): shape ``(rows, L, vocab)``, log-softmax of the
                logits at each position.

        Returns:
            tuple: ``(logits (rows, L, vocab), drawn (rows,) bool)``: each
            drawn row's filtered logits divided by its temperature (its
            categorical draw's input, as :meth:`__call__` draws), and which
            rows draw; ``(None, None)`` when every row is greedy.
        """
        import mlx.core as mx

        if self._plan is None:
            self._plan = _Plan.of(self._rows)
        plan = self._plan
        if plan.sampled is None:
            return None, None
        rows, width, vocab = logprobs.shape

        def spread(column: Any) -> Any:  # a (rows, 1) setting for every position
            return None if column is None else mx.repeat(column, width, axis=0)

        flat = _Plan(
            plan.sampled,
            spread(plan.inv_temp),
            spread(plan.top_p),
            spread(plan.log_min_p),
            spread(plan.top_k),
            [],
        )
        out = _filtered(logprobs.reshape(rows * width, vocab), flat)
        out = out * flat.inv_temp.astype(out.dtype)
        return out.reshape(rows, width, vocab), plan.sampled


@dataclass
class _Plan:
    """The batch's per-row sampling arrays (``None`` where no row uses a filter)."""

    sampled: Any  # (rows,) bool: drawn, not greedy; None when every row is greedy
    inv_temp: Any  # (rows, 1) float32, 1 for greedy rows
    top_p: Any  # (rows, 1) float32, or None
    log_min_p: Any  # (rows, 1) float32 (-inf where off), or None
    top_k: Any  # (rows, 1) int32 (0 where off), or None
    custom: list[tuple[int, Callable]]

    @classmethod
    def of(cls, rows: Sequence[RowSampling]) -> _Plan:
        import math

        import mlx.core as mx

        drawn = [r.custom is None and r.temperature > 0 for r in rows]
        custom = [(i, r.custom) for i, r in enumerate(rows) if r.custom is not None]
        if not any(drawn):
            return cls(None, None, None, None, None, custom)
        on = [(d, r) for d, r in zip(drawn, rows, strict=True)]
        top_p = [r.top_p if d and 0 < r.top_p < 1.0 else 1.0 for d, r in on]
        min_p = [math.log(r.min_p) if d and r.min_p > 0 else -math.inf for d, r in on]
        top_k = [r.top_k if d and r.top_k > 0 else 0 for d, r in on]

        def column(values: list, dtype: Any, used: bool) -> Any:
            return mx.array(values, dtype=dtype)[:, None] if used else None

        return cls(
            sampled=mx.array(drawn),
            inv_temp=column([1.0 / r.temperature if d else 1.0 for d, r in on], mx.float32, True),
            top_p=column(top_p, mx.float32, any(p < 1.0 for p in top_p)),
            log_min_p=column(min_p, mx.float32, any(p > -math.inf for p in min_p)),
            top_k=column(top_k, mx.int32, any(top_k)),
            custom=custom,
        )


def _draw(logprobs: Any, plan: _Plan) -> Any:
    """mlx-lm's ``make_sampler`` chain for every row at once: top-p, min-p and
    top-k masks (:func:`_filtered`), then a categorical draw at each row's
    temperature."""
    import mlx.core as mx

    out = _filtered(logprobs, plan)
    return mx.random.categorical(out * plan.inv_temp.astype(out.dtype)).astype(mx.uint32)


def _filtered(logprobs: Any, plan: _Plan) -> Any:
    """The top-p, min-p and top-k masks of mlx-lm's ``make_sampler`` chain,
    for every row at once (masked tokens become ``-inf``).

    Per-row settings are cast to the log-probabilities' dtype where mlx-lm uses
    a Python float (a weak scalar), so each row rounds as mlx-lm's own sampler
    rounds it. One ascending sort serves top-p and top-k: the masks only set
    values to ``-inf``, so the order of the tokens they keep never changes.
    Top-k keeps every token tied with the k-th largest (mlx-lm's
    ``argpartition`` keeps exactly k of them).
    """
    import mlx.core as mx

    dtype, vocab = logprobs.dtype, logprobs.shape[-1]
    out = logprobs
    ordered = None
    if plan.top_p is not None or plan.top_k is not None:
        ordered = mx.sort(logprobs, axis=-1)
    if plan.top_p is not None:  # apply_top_p, with top_p per row (1.0 = off)
        assert ordered is not None
        probs = mx.exp(ordered.astype(mx.float32))
        above = mx.cumsum(probs, axis=-1, reverse=True, inclusive=False)
        total = above[..., :1] + probs[..., :1]
        dropped = (above >= plan.top_p * total).sum(axis=-1, keepdims=True)
        threshold = mx.take_along_axis(ordered, dropped, axis=-1)
        kept = mx.where(out < threshold, -float("inf"), out)
        out = mx.where(plan.top_p < 1.0, kept, out)
    if plan.log_min_p is not None:  # apply_min_p (min_tokens_to_keep = 1)
        floor = mx.max(out, axis=-1, keepdims=True) + plan.log_min_p.astype(dtype)
        out = mx.where(out < floor, -float("inf"), out)
    if plan.top_k is not None:  # apply_top_k: the k-th largest of the original order
        assert ordered is not None
        at = mx.clip(vocab - plan.top_k, 0, vocab - 1)
        kth = mx.take_along_axis(ordered, at, axis=-1)
        kept = mx.where(out < kth, -float("inf"), out)
        out = mx.where(plan.top_k > 0, kept, out)
    return out


@dataclass(frozen=True)
class LogprobPlan:
    """The rows of a batch that report logprobs.

    Args:
        rows (tuple[int, ...]): their positions in the batch.
        top (tuple[int, ...]): how many candidates each wants (0 for none).
    """

    rows: tuple[int, ...]
    top: tuple[int, ...]

    @classmethod
    def of(cls, wants: Sequence[int | None]) -> LogprobPlan:
        """From each row's wish: ``None`` for no logprobs, else its ``top_logprobs``."""
        picked = [(i, k) for i, k in enumerate(wants) if k is not None]
        return cls(tuple(i for i, _ in picked), tuple(k for _, k in picked))


def logprob_rows(logprobs: Any, tokens: Any, plan: LogprobPlan) -> tuple[Any, ...]:
    """The reported rows' token log-probabilities and top candidates, in-graph.

    The candidates are found as :func:`~mlxspec.engine.loop.rows.token_logprob`
    finds them (``argpartition`` of the negated row, then sorted by descending
    log-probability), once at the largest ``top`` of the batch; each row later
    keeps its own first ``top``.

    Args:
        logprobs (mx.array): shape ``(rows, vocab)``.
        tokens (mx.array): shape ``(rows,)``, the sampled ids.
        plan (LogprobPlan): which rows report, and how many candidates.

    Returns:
        tuple: ``()`` when no row reports; else ``(values (n,), ids (n, k), top
        values (n, k))`` with ``k`` the largest ``top`` (the last two ``None``
        when it is 0).
    """
    import mlx.core as mx

    if not plan.rows:
        return ()
    index = mx.array(plan.rows)
    picked = logprobs[index]
    values = mx.take_along_axis(picked, tokens[index][:, None].astype(mx.int32), axis=-1)[:, 0]
    k = max(plan.top)
    if k == 0:
        return values, None, None
    ids = mx.argpartition(-picked, kth=k - 1, axis=-1)[:, :k]
    top = mx.take_along_axis(picked, ids, axis=-1)
    order = mx.argsort(-top, axis=-1)
    return values, mx.take_along_axis(ids, order, axis=-1), mx.take_along_axis(top, order, axis=-1)

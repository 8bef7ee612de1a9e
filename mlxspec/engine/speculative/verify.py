"""Which drafts a verify step keeps, for every row at once.

The target model scored each row's last token and its ``k`` drafts in one
forward: ``logprobs[:, j]`` is its distribution for the token after draft ``j``
(position 0 follows the last accepted token). A row keeps drafts while the
target agrees and then emits one token of the target's own, so every step
emits between 1 and ``k + 1`` tokens a row:

- greedy rows keep the longest prefix of drafts equal to the target's argmax
  at the same position; the next token is the argmax after it, so the output
  is token for token the one of plain greedy decoding;
- drawn rows use the speculative-sampling rule (Leviathan et al. 2023,
  "Fast Inference from Transformers via Speculative Decoding", Algorithm 1;
  Chen et al. 2023): draft ``d`` drawn from ``q`` is kept with probability
  ``min(1, p(d) / q(d))``; at the first rejection the token is drawn from
  ``max(0, p - q)`` normalised, and after a fully kept draft from ``p``. The
  output then follows the target's sampling distribution ``p`` exactly. A
  prompt-lookup draft is a point mass (``q(d) = 1``): kept with probability
  ``p(d)``, else drawn from ``p`` without ``d``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def verify_graph(
    logprobs: Any,
    drafts: Any,
    lengths: Any,
    scaled: Any = None,
    drawn: Any = None,
    q: Any = None,
) -> tuple[Any, Any]:
    """The acceptance test and each position's stopping token, in-graph.

    Args:
        logprobs (mx.array): shape ``(rows, k + 1, vocab)``, the target's
            log-probabilities at each position.
        drafts (mx.array): shape ``(rows, k)``, ``int32`` draft ids (padded
            past each row's length).
        lengths (mx.array): shape ``(rows,)``, ``int32``: each row's drafts.
        scaled (mx.array | None): shape ``(rows, k + 1, vocab)``: what each
            drawn row samples from (filtered logits over temperature,
            :meth:`~mlxspec.engine.sampling.batch_sampler.BatchSampler.scaled`);
            ``None`` when every row is greedy. Default: ``None``.
        drawn (mx.array | None): shape ``(rows,)``, ``bool``: rows that draw.
            Default: ``None``.
        q (mx.array | None): shape ``(rows, k, vocab)``, the draft model's
            probabilities of each draft position; ``None`` for point-mass
            drafts. Default: ``None``.

    Returns:
        tuple: ``(accepted (rows, k) bool, stop (rows, k + 1) uint32)``:
        whether draft ``j`` passes (given every earlier one did), and the
        token a row emits when it stops at position ``j``.
    """
    import mlx.core as mx

    k = drafts.shape[1]
    greedy = mx.argmax(logprobs, axis=-1).astype(mx.uint32)
    accepted = drafts.astype(mx.uint32) == greedy[:, :k]
    if scaled is None:
        return accepted, greedy
    probs = mx.softmax(scaled.astype(mx.float32), axis=-1)
    head = probs[:, :k]
    p_d = mx.take_along_axis(head, drafts[..., None], axis=-1)[..., 0]
    if q is None:
        ratio = p_d
        residual = mx.where(mx.arange(head.shape[-1]) == drafts[..., None], 0.0, head)
    else:
        q_d = mx.take_along_axis(q, drafts[..., None], axis=-1)[..., 0]
        ratio = p_d / mx.maximum(q_d, 1e-30)
        residual = mx.maximum(head - q.astype(mx.float32), 0.0)
    kept = mx.random.uniform(shape=ratio.shape) < ratio
    mass = residual.sum(axis=-1, keepdims=True)
    fallback = scaled[:, :k].astype(mx.float32)
    redraw = mx.random.categorical(mx.where(mass > 0, mx.log(residual), fallback))
    plain = mx.random.categorical(scaled)
    positions = mx.arange(k + 1)[None]
    stop_drawn = mx.where(
        positions < lengths[:, None], mx.concatenate([redraw, plain[:, k:]], axis=1), plain
    ).astype(mx.uint32)
    accepted = mx.where(drawn[:, None], kept, accepted)
    stop = mx.where(drawn[:, None], stop_drawn, greedy)
    return accepted, stop


def kept_runs(
    drafts: Sequence[Sequence[int]],
    accepted: Sequence[Sequence[bool]],
    stop: Sequence[Sequence[int]],
) -> list[list[int]]:
    """Each row's emitted tokens, from a verify step's host-read verdict.

    Args:
        drafts (Sequence[Sequence[int]]): each row's drafts (any length ``<= k``).
        accepted (Sequence[Sequence[bool]]): :func:`verify_graph`'s ``accepted``.
        stop (Sequence[Sequence[int]]): :func:`verify_graph`'s ``stop``.

    Returns:
        list[list[int]]: per row, its kept drafts and then the stopping token
        (``1`` to ``len(drafts[i]) + 1`` tokens).
    """
    out = []
    for mine, ok, ends in zip(drafts, accepted, stop, strict=True):
        n = 0
        while n < len(mine) and ok[n]:
            n += 1
        out.append([*mine[:n], ends[n]])
    return out

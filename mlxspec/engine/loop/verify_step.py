"""A speculative verify step of :class:`~.decode.DecodeBatch` (engine thread only).

Split from :mod:`.decode` for size; it is the batch's own step and works on its
state. Every decoding row feeds its last token and its drafts, padded to the
step's longest draft ``k`` (a row without drafts feeds ``k`` padding tokens),
in one forward of ``(rows, k + 1)`` tokens; position 0 goes through the
batch's logits processors and sampler as a plain decode step would (so rows
that do not speculate decode exactly as without a draft source), the
speculator decides what the speculating rows keep
(:meth:`~mlxspec.engine.speculative.Speculator.verify`; a fill row's drafts are
its grammar's forced span, checked under the grammar's mask at each position,
:mod:`~mlxspec.engine.speculative.fill`), and each row's KV cache
drops its rejected positions
(:meth:`~mlxspec.engine.caches.batch_kv.RowsKVCache.rewind`). The step reads the
host at once: the next drafts need these tokens.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from mlxspec.engine.loop.rows import StepLogprobs
from mlxspec.engine.sampling.batch_sampler import LogprobPlan, logprob_rows

if TYPE_CHECKING:
    from mlxspec.engine.loop.decode import DecodeBatch, Token
    from mlxspec.engine.speculative import Speculator


def verify_step(batch: DecodeBatch, spec: Speculator, route: Callable[[list[Token]], None]) -> bool:
    """Run one verify step of ``batch`` 's decoding rows if any row has drafts.

    Args:
        batch (DecodeBatch): the batch, with no step in flight.
        spec (Speculator): its speculator.
        route (Callable[[list[Token]], None]): gets the step's tokens, a row's
            in order (several per speculating row).

    Returns:
        bool: False when no row had a draft (nothing ran: the caller runs a
        plain decode step).
    """
    import mlx.core as mx

    from mlxspec.engine.loop.decode import Token

    rows = list(batch._rows)
    proposal = spec.propose(rows, batch._sampler)
    drafts = proposal.drafts
    if not any(drafts):
        return False
    start = time.perf_counter()
    spec.launched(rows)
    k = max(len(d) for d in drafts)
    fed = [[s.seq[-1], *d, *([0] * (k - len(d)))] for s, d in zip(rows, drafts, strict=True)]
    assert batch._cache is not None
    logits = batch.forward(mx.array(fed, dtype=mx.uint32), batch._cache, rows)
    first = batch._logits(logits[:, 0, :], batch._inputs)  # processors see position 0 only
    first = first - mx.logsumexp(first, axis=-1, keepdims=True)
    plain = batch._sampler(first)
    rest = spec.masked(logits[:, 1:, :], proposal)  # fill rows: their grammar after each span token
    rest = rest - mx.logsumexp(rest, axis=-1, keepdims=True)
    logprobs = mx.concatenate([first[:, None], rest], axis=1)
    mx.async_eval(plain)
    runs = spec.verify(logprobs, proposal, batch._sampler)
    firsts = plain.tolist()
    runs = [run if d else [firsts[i]] for i, (run, d) in enumerate(zip(runs, drafts, strict=True))]
    spec.count(rows, proposal, runs)
    for c in batch._cache:
        c.rewind([k + 1 - len(run) for run in runs])
    spec.settle(rows, [len(run) for run in runs])
    lps = _logprobs(logprobs, runs, batch._plan)
    tokens = []
    for i, (slot, run) in enumerate(zip(rows, runs, strict=True)):
        slot.seq.extend(run)
        slot.kv = len(slot.seq) - 1
        for j, token in enumerate(run):
            slot.generated += 1
            tokens.append(Token(slot, token, lps.get((i, j)), slot.generated))
    batch._inputs = mx.array([s.seq[-1] for s in rows], dtype=mx.uint32)
    batch.clock.steps += 1
    batch.clock.build_s += time.perf_counter() - start
    route(tokens)
    return True


def _logprobs(
    logprobs: Any, runs: Sequence[Sequence[int]], plan: LogprobPlan
) -> dict[tuple[int, int], StepLogprobs]:
    """The reported rows' logprobs of each emitted token, keyed ``(row, position)``.

    Args:
        logprobs (mx.array): shape ``(rows, k + 1, vocab)``.
        runs (Sequence[Sequence[int]]): per row, its emitted tokens.
        plan (LogprobPlan): which rows report, and their ``top_logprobs``.
    """
    import mlx.core as mx

    if not plan.rows:
        return {}
    keys, tops, ids = [], [], []
    for i, top in zip(plan.rows, plan.top, strict=True):
        for j, token in enumerate(runs[i]):
            keys.append((i, j))
            tops.append(top)
            ids.append(token)
    picked = logprobs[mx.array([i for i, _ in keys]), mx.array([j for _, j in keys])]
    every = LogprobPlan(tuple(range(len(keys))), tuple(tops))
    values, top_ids, top_values = logprob_rows(picked, mx.array(ids, dtype=mx.uint32), every)
    vals = values.tolist()
    tids = top_ids.tolist() if top_ids is not None else [[] for _ in vals]
    tvals = top_values.tolist() if top_values is not None else [[] for _ in vals]
    return {
        key: StepLogprobs(vals[n], tids[n][: tops[n]], tvals[n][: tops[n]])
        for n, key in enumerate(keys)
    }

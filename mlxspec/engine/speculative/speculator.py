"""The one hook :class:`~mlxspec.engine.loop.decode.DecodeBatch` consults for
speculative decoding: which rows draft, their drafts, and what a verify step
keeps; with the per-row and server-wide counters.

A row speculates when its request is :func:`speculable`: text on the base
weights, sampled by the batch's vectorised sampler (greedy, or drawn without a
``seed`` or XTC) and with no logits processor or grammar, since those change
``p`` token by token in ways a multi-token verify step does not replay. Other
rows decode beside them a token per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mlxspec.engine.speculative.verify import kept_runs, verify_graph
from mlxspec.engine.types import GenerationRequest, Speculation

if TYPE_CHECKING:
    from mlxspec.engine.loop.prefill import Slot
    from mlxspec.engine.sampling.batch_sampler import BatchSampler


class DraftSource(Protocol):
    """Where drafts come from (:class:`~.ngram.NgramDrafts`, :class:`~.draft_model.DraftModel`)."""

    #: Short name reported in ``/stats`` (``"ngram"`` or ``"model"``).
    kind: str

    def draft(
        self, rows: Sequence[Slot], ks: Sequence[int], sampler: BatchSampler
    ) -> tuple[list[list[int]], Any]:
        """Up to ``ks[i]`` drafts for row ``i``, and their probabilities
        ``(rows, max k, vocab)`` (``None`` for point-mass drafts)."""
        ...

    def join(self, rows: Sequence[Slot]) -> None:
        """Rows joined the batch's decoding rows, appended in this order."""
        ...

    def settle(self, rows: Sequence[Slot], kept: Sequence[int]) -> None:
        """After a verify step: row ``i`` kept ``kept[i]`` tokens (its seq grew by them)."""
        ...

    def leave(self, keep: Sequence[int]) -> None:
        """Rows left the batch: only those at ``keep`` remain, in that order."""
        ...


@dataclass
class SpecCounts:
    """One request's speculation counters (``usage.speculation``) and its
    draft-length schedule.

    A verify step costs more than a plain decode step (``k + 1`` positions
    through the model, and no pipelining), so drafts that miss make decoding
    slower. Each row adapts its lookahead as Hugging Face's assisted
    generation does (``num_assistant_tokens_schedule="heuristic"``: two more
    after a fully kept draft, one fewer otherwise), and a row whose drafts keep
    missing entirely, or finding none, pauses drafting for 1, 3, 7, then 15
    steps (plain, pipelined steps meanwhile when no row drafts).

    Attributes:
        drafted (int): draft tokens proposed for it.
        accepted (int): drafts its verify steps kept.
        target_calls (int): target-model forward calls that decoded it.
        lookahead (int): drafts its next step may take (``0``: not set yet).
        pause (int): steps left before it drafts again.
        misses (int): steps in a row whose drafts all missed, or that found none.
        resting (bool): it does not draft in the current step.
    """

    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    lookahead: int = 0
    pause: int = 0
    misses: int = 0
    resting: bool = False

    def adapt(self, drafted: int, kept: int, most: int) -> None:
        """Update the schedule after a verify step that kept ``kept`` of
        ``drafted`` drafts (``most``: ``--num-draft-tokens``)."""
        if kept == drafted:
            self.lookahead = min(most, max(self.lookahead, drafted) + 2)
        else:
            self.lookahead = max(1, min(self.lookahead, drafted) - 1)
        self.misses = self.misses + 1 if kept == 0 else 0
        self.pause = 2 ** min(self.misses, 4) - 1 if self.misses else 0

    def found_none(self) -> None:
        """The draft source had nothing for it: rest as after a missed draft."""
        self.misses += 1
        self.pause = 2 ** min(self.misses, 4) - 1

    def frozen(self) -> Speculation:
        """The counters as the engine's typed ``Speculation``."""
        return Speculation(self.drafted, self.accepted, self.target_calls)


@dataclass
class SpecStats:
    """Server-wide speculation counters since start (``/stats``, ``/metrics``).

    Attributes:
        kind (str): the draft source (``"ngram"`` or ``"model"``).
        num_draft (int): most drafts per row and step.
        drafted (int): draft tokens proposed.
        accepted (int): drafts kept.
        verify_steps (int): batch forwards that verified drafts.
        target_calls (int): row decode steps (one row's share of a forward)
            of speculating rows.
        kept_hist (list[int]): index ``n``: row verifications that kept ``n`` drafts.
    """

    kind: str
    num_draft: int
    drafted: int = 0
    accepted: int = 0
    verify_steps: int = 0
    target_calls: int = 0
    kept_hist: list[int] = field(default_factory=list)

    def snapshot(self) -> dict[str, Any]:
        """The ``/stats`` ``speculation`` block."""
        rate = self.accepted / self.drafted if self.drafted else 0.0
        return {
            "kind": self.kind,
            "num_draft_tokens": self.num_draft,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "acceptance_rate": round(rate, 4),
            "verify_steps": self.verify_steps,
            "target_calls": self.target_calls,
            "accepted_histogram": list(self.kept_hist),
        }


def speculable(request: GenerationRequest) -> bool:
    """Whether ``request`` may speculate (the rule in the module docstring).

    Args:
        request (GenerationRequest): the engine request.

    Returns:
        bool: True when its rows may carry drafts.
    """
    from mlxspec.engine.sampling.sampler import build_logits_processors, sampler_settings

    temperature, _, _, _, xtc, _ = sampler_settings(request.sampling)
    plain_sampler = temperature == 0 or (request.sampling.seed is None and xtc == 0)
    return (
        plain_sampler
        and not request.adapter
        and request.constraint is None
        and not build_logits_processors(request.logits)
    )


class Speculator:
    """Drafts and verification for a :class:`~mlxspec.engine.loop.decode.DecodeBatch`.

    Args:
        source (DraftSource): where drafts come from.
        num_draft (int): most drafts per row and step (``--num-draft-tokens``).
    """

    def __init__(self, source: DraftSource, num_draft: int) -> None:
        self.source = source
        self.num_draft = num_draft
        self.stats = SpecStats(source.kind, num_draft, kept_hist=[0] * (num_draft + 1))

    def join(self, rows: Sequence[Slot]) -> None:
        """Rows joined the batch's decoding rows, appended in this order."""
        self.source.join(rows)

    def leave(self, keep: Sequence[int]) -> None:
        """Rows left: only those at ``keep`` remain, in that order (``[]``: all gone)."""
        self.source.leave(keep)

    def settle(self, rows: Sequence[Slot], kept: Sequence[int]) -> None:
        """After a verify step: row ``i`` 's sequence grew by ``kept[i]`` tokens."""
        self.source.settle(rows, kept)

    def wants(self, rows: Sequence[Slot]) -> bool:
        """Start a decode step: tick the speculating rows' pauses and say
        whether any of them drafts in it (if none does, the batch runs a plain,
        pipelined step).

        Args:
            rows (Sequence[Slot]): the batch's decoding rows.

        Returns:
            bool: True when a row may draft in this step.
        """
        drafting = False
        for slot in rows:
            spec = slot.row.spec
            if spec is None:
                continue
            spec.resting = spec.pause > 0
            if spec.resting:
                spec.pause -= 1
            drafting = drafting or not spec.resting
        return drafting

    def launched(self, rows: Sequence[Slot]) -> None:
        """A target forward (plain or verify step) decodes ``rows``: count it."""
        for slot in rows:
            if slot.row.spec is not None:
                slot.row.spec.target_calls += 1
                self.stats.target_calls += 1

    def wasted(self, rows: Sequence[Slot]) -> None:
        """``rows`` left with a launched step unread (the pipelined step after
        their last token): that call decoded nothing for them, uncount it."""
        for slot in rows:
            if slot.row.spec is not None:
                slot.row.spec.target_calls -= 1
                self.stats.target_calls -= 1

    def propose(self, rows: Sequence[Slot], sampler: BatchSampler) -> tuple[list[list[int]], Any]:
        """Each decoding row's drafts for this step (empty for rows that do not
        speculate or rest, and never more than its budget leaves room for);
        called after :meth:`wants` said some row drafts.

        Args:
            rows (Sequence[Slot]): the batch's decoding rows, in order.
            sampler (BatchSampler): the batch's sampler (a draft model samples
                its drafts with the rows' settings).

        Returns:
            tuple: ``(drafts, q)``: per row its drafts; the draft
            probabilities (``None`` for point-mass drafts).
        """
        ks = []
        for slot in rows:
            spec = slot.row.spec
            if spec is None or spec.resting:
                ks.append(0)
                continue
            most = spec.lookahead or self.num_draft
            ks.append(max(0, min(most, slot.budget - slot.generated - 1)))
        if not any(ks):
            return [[] for _ in rows], None
        drafts, q = self.source.draft(rows, ks, sampler)
        for slot, k, mine in zip(rows, ks, drafts, strict=True):
            if k and not mine and slot.row.spec is not None:
                slot.row.spec.found_none()
        return drafts, q

    def verify(
        self,
        logprobs: Any,
        drafts: Sequence[Sequence[int]],
        sampler: BatchSampler,
        q: Any = None,
    ) -> list[list[int]]:
        """Decide each row's kept tokens from the verify forward (one host read).

        Args:
            logprobs (mx.array): shape ``(rows, k + 1, vocab)``, the target's
                log-probabilities after the last token and each draft.
            drafts (Sequence[Sequence[int]]): per row, its drafts (``<= k``).
            sampler (BatchSampler): the batch's sampler (each row's settings).
            q (mx.array | None): the drafts' probabilities, ``(rows, k, vocab)``.

        Returns:
            list[list[int]]: per row, the tokens it emits (kept drafts, then
            one of the target's own).
        """
        import mlx.core as mx

        k = max(len(d) for d in drafts)
        padded = mx.array([[*d, *([0] * (k - len(d)))] for d in drafts], dtype=mx.int32)
        lengths = mx.array([len(d) for d in drafts], dtype=mx.int32)
        scaled, drawn = sampler.scaled(logprobs)
        accepted, stop = verify_graph(logprobs, padded, lengths, scaled, drawn, q)
        mx.eval(accepted, stop)
        runs = kept_runs(drafts, accepted.tolist(), stop.tolist())
        self.stats.verify_steps += 1
        return runs

    def count(
        self, rows: Sequence[Slot], drafts: Sequence[Sequence[int]], runs: Sequence[Sequence[int]]
    ) -> None:
        """Add a verify step's drafted and kept tokens to the rows' and the
        server's counters."""
        for slot, mine, run in zip(rows, drafts, runs, strict=True):
            if not mine:
                continue
            kept = len(run) - 1
            self.stats.drafted += len(mine)
            self.stats.accepted += kept
            self.stats.kept_hist[kept] += 1
            spec = slot.row.spec
            if spec is not None:
                spec.drafted += len(mine)
                spec.accepted += kept
                spec.adapt(len(mine), kept, self.num_draft)

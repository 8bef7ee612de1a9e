"""The one hook :class:`~mlxspec.engine.loop.decode.DecodeBatch` consults for
speculative decoding: which rows draft, their drafts, and what a verify step
keeps; with the per-row and server-wide counters.

A row speculates when its request is :func:`speculable`: text on the base
weights, sampled by the batch's vectorised sampler (greedy, or drawn without a
``seed`` or XTC) and with no logits processor or grammar, since those change
``p`` token by token in ways a multi-token verify step does not replay. Under
``--fill strict`` a row with a grammar (:func:`~.fill.fillable`) takes the
text its grammar forces as its drafts instead (:mod:`.fill`), checked under
the grammar's mask at every position. Other rows decode beside them a token
per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from mlxspec.engine.speculative.fill import Filler, fixed_cost, span_length
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
        source (DraftSource | None): where drafts come from (``None``: fill only).
        num_draft (int): most drafts per row and step (``--num-draft-tokens``).
        fill (Filler | None): forced spans of grammar rows (``--fill strict``).
            Default: ``None``.
    """

    def __init__(
        self, source: DraftSource | None, num_draft: int, fill: Filler | None = None
    ) -> None:
        self.source = source
        self.num_draft = num_draft
        self.fill = fill
        #: A forward's fixed cost in positions' worth, for fill's cost rule
        #: (:func:`~.fill.span_length`): the device's :data:`~.fill.FIXED_COST`.
        self.fill_cost = fixed_cost()
        #: The draft source's counters (``/stats`` ``speculation``); ``None`` without one.
        self.stats = (
            None
            if source is None
            else SpecStats(source.kind, num_draft, kept_hist=[0] * (num_draft + 1))
        )

    def join(self, rows: Sequence[Slot]) -> None:
        """Rows joined the batch's decoding rows, appended in this order."""
        if self.source is not None:
            self.source.join(rows)

    def leave(self, keep: Sequence[int]) -> None:
        """Rows left: only those at ``keep`` remain, in that order (``[]``: all gone)."""
        if self.source is not None:
            self.source.leave(keep)

    def settle(self, rows: Sequence[Slot], kept: Sequence[int]) -> None:
        """After a verify step: row ``i`` 's sequence grew by ``kept[i]`` tokens."""
        if self.source is not None:
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
            drafting = drafting or slot.row.fill is not None
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
            if slot.row.spec is not None and self.stats is not None:
                slot.row.spec.target_calls += 1
                self.stats.target_calls += 1

    def wasted(self, rows: Sequence[Slot]) -> None:
        """``rows`` left with a launched step unread (the pipelined step after
        their last token): that call decoded nothing for them, uncount it."""
        for slot in rows:
            if slot.row.spec is not None and self.stats is not None:
                slot.row.spec.target_calls -= 1
                self.stats.target_calls -= 1

    def propose(self, rows: Sequence[Slot], sampler: BatchSampler) -> Proposal:
        """Each decoding row's drafts for this step (empty for rows that do not
        speculate or rest, and never more than its budget leaves room for):
        the draft source's for speculating rows, the forced span for fill rows;
        called after :meth:`wants` said some row drafts.

        Args:
            rows (Sequence[Slot]): the batch's decoding rows, in order.
            sampler (BatchSampler): the batch's sampler (a draft model samples
                its drafts with the rows' settings).

        Returns:
            Proposal: the drafts, their probabilities and the fill rows' masks.
        """
        ks = []
        for slot in rows:
            spec = slot.row.spec
            if spec is None or spec.resting:
                ks.append(0)
                continue
            most = spec.lookahead or self.num_draft
            ks.append(max(0, min(most, slot.budget - slot.generated - 1)))
        drafts: list[list[int]] = [[] for _ in rows]
        q = None
        if any(ks) and self.source is not None:
            drafts, q = self.source.draft(rows, ks, sampler)
            for slot, k, mine in zip(rows, ks, drafts, strict=True):
                if k and not mine and slot.row.spec is not None:
                    slot.row.spec.found_none()
        masks: dict[int, Any] = {}
        if self.fill is not None:
            self._fill(rows, drafts, masks)
        return Proposal(drafts, q, masks)

    def _fill(self, rows: Sequence[Slot], drafts: list[list[int]], masks: dict[int, Any]) -> None:
        """Put the fill rows' spans into ``drafts`` (and their masks into
        ``masks``), cut to the length the step's cost allows (:func:`~.fill.span_length`)."""
        assert self.fill is not None
        spans = {}
        for i, slot in enumerate(rows):
            if slot.row.fill is not None:
                span, cut = self.fill.tokens(slot, slot.budget - slot.generated - 1)
                if span:
                    spans[i] = (span, cut)
        if not spans:
            return
        floor = max((len(d) for d in drafts), default=0)
        lengths = [len(span) for span, _ in spans.values()]
        k = span_length(len(rows), lengths, floor, self.fill_cost, self.fill.agreement)
        for i, (span, cut) in spans.items():
            if k <= 0:
                break
            fed, mask = self.fill.check(rows[i], span[:k], cut or len(span) > k)
            if fed:
                drafts[i], masks[i] = fed, mask

    def masked(self, logits: Any, proposal: Proposal) -> Any:
        """The verify forward's logits after each draft, with the fill rows'
        grammar masks applied (a forbidden token is ``-inf``).

        Args:
            logits (mx.array): shape ``(rows, k, vocab)``: positions ``1..k``.
            proposal (Proposal): the step's proposal.

        Returns:
            mx.array: ``logits``, masked where a fill row's span reaches.
        """
        import mlx.core as mx
        import numpy as np

        if not proposal.masks:
            return logits
        rows, k, width = logits.shape
        allowed = np.ones((rows, k, width), dtype=bool)
        for i, mask in proposal.masks.items():
            n, vocab = mask.shape
            allowed[i, :n, :] = False
            allowed[i, :n, : min(vocab, width)] = mask[:, :width]
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))

    def verify(self, logprobs: Any, proposal: Proposal, sampler: BatchSampler) -> list[list[int]]:
        """Decide each row's kept tokens from the verify forward (one host read).

        Args:
            logprobs (mx.array): shape ``(rows, k + 1, vocab)``, the target's
                log-probabilities after the last token and each draft (fill
                rows' masked, :meth:`masked`).
            proposal (Proposal): the step's drafts (``<= k`` a row).
            sampler (BatchSampler): the batch's sampler (each row's settings).

        Returns:
            list[list[int]]: per row, the tokens it emits (kept drafts, then
            one of the target's own).
        """
        import mlx.core as mx

        drafts = proposal.drafts
        k = max(len(d) for d in drafts)
        padded = mx.array([[*d, *([0] * (k - len(d)))] for d in drafts], dtype=mx.int32)
        lengths = mx.array([len(d) for d in drafts], dtype=mx.int32)
        scaled, drawn = sampler.scaled(logprobs)
        q = proposal.q
        if q is not None and proposal.masks:  # spans are point masses beside the model's drafts
            q = mx.pad(q, [(0, 0), (0, k - q.shape[1]), (0, 0)])
            point = mx.arange(q.shape[-1])[None, None] == padded[..., None]
            filling = mx.array([i in proposal.masks for i in range(len(drafts))])
            q = mx.where(filling[:, None, None], point.astype(q.dtype), q)
        accepted, stop = verify_graph(logprobs, padded, lengths, scaled, drawn, q)
        mx.eval(accepted, stop)
        runs = kept_runs(drafts, accepted.tolist(), stop.tolist())
        if self.stats is not None:
            self.stats.verify_steps += 1
        return runs

    def count(
        self, rows: Sequence[Slot], proposal: Proposal, runs: Sequence[Sequence[int]]
    ) -> None:
        """Add a verify step's drafted and kept tokens to the rows' and the
        server's counters (the fill rows' to :class:`~.fill.Filler`'s)."""
        if self.fill is not None and proposal.masks:
            self.fill.count(rows, proposal.spans, runs)
        for i, (slot, mine, run) in enumerate(zip(rows, proposal.drafts, runs, strict=True)):
            if not mine or i in proposal.masks or self.stats is None:
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


@dataclass
class Proposal:
    """One verify step's drafts.

    Attributes:
        drafts (list[list[int]]): per row, its drafts (``[]``: none).
        q (mx.array | None): the draft model's probabilities, ``(rows, k', vocab)``.
        masks (dict[int, np.ndarray]): per fill row (by index), the grammar's
            masks after each span token, ``(len(span), vocab)`` bool.
    """

    drafts: list[list[int]]
    q: Any = None
    masks: dict[int, Any] = field(default_factory=dict)

    @property
    def spans(self) -> list[int]:
        """Per row, its span's length (``0`` for rows that do not fill)."""
        return [len(d) if i in self.masks else 0 for i, d in enumerate(self.drafts)]

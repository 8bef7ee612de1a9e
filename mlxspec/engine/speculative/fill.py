"""Token fast-forwarding (``--fill strict``): the text a row's grammar forces
next, fed to the model as drafts of the batch's verify step.

Where a request's grammar (structured output, or the grammar of a forced tool
call, whose object keys are fixed) admits exactly one continuation, xgrammar
names it (``GrammarMatcher.find_jump_forward_string``). :class:`Filler` turns
it into tokens and the verify step (:func:`~mlxspec.engine.loop.verify_step.verify_step`)
feeds them to the model in one forward beside the other rows' tokens and drafts.

A forced string has several tokenizations, and the greedy output is the one
the model picks token by token, not necessarily the tokenizer's encoding of
the string (at its end above all: a token may reach past the forced text into
the free one). So the span is checked, not asserted: each position's logits
get the grammar's mask after the span's tokens before it
(:meth:`~mlxspec.engine.sampling.grammar.GrammarProcessor.lookahead`) and the
verify rule keeps the longest prefix the model agrees with plus a token of its
own, exactly as for speculative drafts. Greedy output is therefore token for
token the output without fill, whatever the tokenizer does at the span's edges;
a span token the model would not have picked costs only its position in the
forward (the model's own token is emitted there), so no back-off is needed.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mlxspec.engine.types import Fill, GenerationRequest

if TYPE_CHECKING:
    from mlxspec.engine.loop.prefill import Slot

#: The values of ``--fill`` / ``MLXSPEC_FILL``.
FILL_MODES = ("off", "strict")

#: Most span tokens one verify step feeds a row: every row of the step pads to
#: the longest, so an unbounded span would cost the other rows.
MAX_SPAN = 16


@dataclass
class FillCounts:
    """One request's fill counters (``usage.fill``, the reference's fields).

    Attributes:
        spans (int): forced spans fed to a verify step (``verifyEvents``).
        proposed (int): their tokens.
        agreed (int): span tokens the verify rule kept (``verifyAccepted``).
        injected (int): span tokens emitted (``injected``, ``strict``): the
            agreed ones but those after the row ended (a stop string in a span).
        span_lens (list[int]): tokens emitted of each span that emitted any, in order.
        truncated (int): spans cut by the token budget or :data:`MAX_SPAN`.
        checkpoint_s (float): host seconds in the grammar's look-ahead and rollback.
        pending (int): of the tokens the row is handed next, how many are kept
            span tokens (they come first in a verify step's run).
        agreed_last (int): the span tokens kept by the last verify step.
    """

    spans: int = 0
    proposed: int = 0
    agreed: int = 0
    injected: int = 0
    span_lens: list[int] = field(default_factory=list)
    truncated: int = 0
    checkpoint_s: float = 0.0
    pending: int = 0
    agreed_last: int = 0

    def take(self) -> None:
        """The row consumed one token: count it as injected if it was a span's."""
        if self.pending > 0:
            if self.pending == self.agreed_last:
                self.span_lens.append(0)
            self.pending -= 1
            self.injected += 1
            self.span_lens[-1] += 1

    def frozen(self, completion_tokens: int) -> Fill:
        """The counters as the engine's typed ``Fill``.

        Args:
            completion_tokens (int): the row's generated tokens (the rest of
                them were sampled: ``decodeSteps``).
        """
        return Fill(
            events=len(self.span_lens),
            injected=self.injected,
            span_lens=tuple(self.span_lens),
            truncated=self.truncated,
            decode_steps=completion_tokens - self.injected,
            verify_events=self.spans,
            verify_accepted=self.agreed,
            verify_rejected=self.proposed - self.agreed,
            checkpoint_ms=round(self.checkpoint_s * 1000, 3),
        )


@dataclass
class FillStats:
    """Server-wide fill counters since start (``/stats`` ``fill``).

    Attributes:
        spans (int): forced spans fed to verify steps.
        proposed (int): their tokens.
        kept (int): span tokens the model agreed with.
        steps (int): verify steps that carried a span.
    """

    spans: int = 0
    proposed: int = 0
    kept: int = 0
    steps: int = 0

    def snapshot(self) -> dict[str, Any]:
        """The ``/stats`` ``fill`` block."""
        return {
            "mode": "strict",
            "spans": self.spans,
            "proposed": self.proposed,
            "injected": self.kept,
            "rejected": self.proposed - self.kept,
            "verify_steps": self.steps,
        }


def fillable(request: GenerationRequest) -> bool:
    """Whether ``request`` may fill: it has a grammar, and is otherwise a
    request that may speculate (:func:`~.speculator.speculable` without the
    grammar rule: base weights, a vectorised sampler, no other logits processor).

    Args:
        request (GenerationRequest): the engine request.

    Returns:
        bool: True when forced spans may be fed to its row.
    """
    from dataclasses import replace

    from mlxspec.engine.speculative.speculator import speculable

    return request.constraint is not None and speculable(replace(request, constraint=None))


class Filler:
    """Forced spans of grammar rows, and the masks that check them.

    Args:
        tokenizer: the served mlx-lm ``TokenizerWrapper`` (encodes a span).
    """

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.stats = FillStats()

    def encode(self, text: str) -> list[int]:
        """``text`` as the tokenizer encodes it, or ``[]`` when those tokens do
        not decode back to exactly ``text`` (a SentencePiece prefix space)."""
        tokens = list(self._tokenizer.encode(text, add_special_tokens=False))
        return tokens if self._tokenizer.decode(tokens) == text else []

    def tokens(self, slot: Slot, most: int) -> tuple[list[int], bool]:
        """``slot`` 's forced span for this step, as tokens (no masks yet).

        The tokenizer's encoding of the jump-forward string comes first (what a
        model trained on that tokenizer writes), xgrammar's own tokenization of
        it when that encoding does not round-trip.

        Args:
            slot (Slot): a fill row (``slot.row.fill`` set, with a grammar).
            most (int): most tokens (its budget's room; :data:`MAX_SPAN` caps it too).

        Returns:
            tuple: ``(tokens, cut)``: the span (possibly empty), and whether
            ``most`` or :data:`MAX_SPAN` cut it.
        """
        counts, grammar = slot.row.fill, slot.grammar
        if counts is None or grammar is None or most <= 0:
            return [], False
        start = time.perf_counter()
        text = grammar.jump_forward()
        tokens = (self.encode(text) or grammar.jump_forward_tokens()) if text else []
        counts.checkpoint_s += time.perf_counter() - start
        cap = min(most, MAX_SPAN)
        return tokens[:cap], len(tokens) > cap

    def check(self, slot: Slot, tokens: list[int], cut: bool) -> tuple[list[int], Any]:
        """The grammar's masks after each token of the span ``slot`` is fed.

        Args:
            slot (Slot): the fill row.
            tokens (list[int]): the span this step feeds (possibly shortened).
            cut (bool): the forced text went on past ``tokens`` (counted as
                ``indexTruncated``).

        Returns:
            tuple: ``(kept, masks)``: the span's prefix the grammar accepts and
            its masks, ``(len(kept), vocab)`` bool (:meth:`~mlxspec.engine.
            sampling.grammar.GrammarProcessor.lookahead`).
        """
        counts, grammar = slot.row.fill, slot.grammar
        assert counts is not None and grammar is not None
        start = time.perf_counter()
        kept, masks = grammar.lookahead(tokens)
        counts.checkpoint_s += time.perf_counter() - start
        counts.truncated += cut
        return kept, masks

    @property
    def agreement(self) -> float:
        """The share of span tokens the model agreed with so far (0.9 before any)."""
        done = self.stats.proposed
        return (self.stats.kept + 9) / (done + 10)

    def count(
        self, rows: Sequence[Slot], spans: Sequence[int], runs: Sequence[Sequence[int]]
    ) -> None:
        """Count a verify step's spans: row ``i`` fed ``spans[i]`` span tokens
        (``0``: none) and emits ``runs[i]`` (kept ones, then one of its own).

        The kept span tokens are marked pending on the row, so the row counts
        them as injected as it consumes them (:meth:`FillCounts.take`): tokens
        after a stop string inside the span are never counted.
        """
        carried = False
        for slot, fed, run in zip(rows, spans, runs, strict=True):
            counts = slot.row.fill
            if not fed or counts is None:
                continue
            carried = True
            kept = len(run) - 1
            counts.spans += 1
            counts.proposed += fed
            counts.agreed += kept
            counts.pending = counts.agreed_last = kept
            self.stats.spans += 1
            self.stats.proposed += fed
            self.stats.kept += kept
        self.stats.steps += carried


def span_length(rows: int, spans: Sequence[int], floor: int, fixed: float, rate: float) -> int:
    """How many span tokens a step feeds each row (``0``: no fill this step).

    A verify step feeds every row ``k + 1`` positions (rows pad to the longest
    span), and a forward costs about ``fixed + positions`` (``fixed``: the
    positions' worth of a forward's fixed cost, reading the weights above all).
    The step takes the ``k`` whose tokens per cost is best, counting a span
    token as ``rate`` of one (the model may disagree), and fills nothing
    when a plain step (``rows`` tokens for ``fixed + rows``) does better. On a
    CPU, where a position costs nearly what a weight read does, that fills a
    lone row's spans and skips a span of one row among eight; on a GPU, where
    a few more positions are almost free, it fills both.

    Args:
        rows (int): the batch's decoding rows.
        spans (Sequence[int]): the fill rows' span lengths this step.
        floor (int): the step's longest speculative draft (it verifies at
            least that many positions anyway; ``0``: none).
        fixed (float): :data:`FIXED_COST` of the device.
        rate (float): expected share of span tokens kept.

    Returns:
        int: ``k`` (``<= max(spans)``); spans are cut to it.
    """
    longest = max(spans, default=0)
    best_k = floor
    if floor == 0:
        best = rows / (fixed + rows)
    else:
        best = (rows + rate * sum(min(s, floor) for s in spans)) / (fixed + rows * (floor + 1))
    for k in range(max(1, floor + 1), longest + 1):
        value = (rows + rate * sum(min(s, k) for s in spans)) / (fixed + rows * (k + 1))
        if value > best:
            best_k, best = k, value
    return min(best_k, longest)


#: A forward's fixed cost in positions' worth, per device type: on this CPU
#: (float32 weights through the BLAS) a 135M model's decode step cost about 2 to
#: 4 positions' compute (``benchmarks/README.md``, fill); on a GPU a step of a
#: few rows reads the weights and its positions are nearly free.
FIXED_COST = {"cpu": 4.0, "gpu": 64.0}


def fixed_cost() -> float:
    """:data:`FIXED_COST` of MLX's default device."""
    import mlx.core as mx

    return FIXED_COST["cpu" if mx.default_device() == mx.cpu else "gpu"]

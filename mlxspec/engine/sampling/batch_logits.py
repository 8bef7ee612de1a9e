"""The logits processors of a whole decode batch, applied to ``(rows, vocab)`` at once.

mlx-lm's ``BatchGenerator`` runs each row's processors (``make_logits_processors``
closures, the grammar mask) on that row's ``(1, vocab)`` slice and
concatenates the rows again: graph nodes, and token-history copies, per row
and step. :class:`BatchLogits` keeps what every row asks for and applies it
to the batch in a fixed number of operations, in mlx-lm's order:

1. ``logit_bias``: one ``(rows, vocab)`` bias matrix, rebuilt only when rows
   join or leave (zero rows for requests without a bias);
2. repetition, presence and frequency penalties (mlx-lm's
   ``make_repetition_penalty``, ``make_presence_penalty``,
   ``make_frequency_penalty``): each row's recent tokens are kept on the
   device in one ``(rows, window)`` history matrix that grows by the step's
   input tokens inside the graph, so it never waits for the host; each penalty
   counts tokens over its rows' windows with one scatter-add;
3. the grammar mask (:class:`~.grammar.GrammarProcessor`, xgrammar's matcher
   on the host): one ``(grammar rows, vocab)`` mask from the rows' allowed
   sets. The matcher must have seen the previous token, so a batch holding a
   grammar row reads each step's tokens before it builds the next
   (:attr:`BatchLogits.needs_host_tokens`).

A row's history is every token its KV cache holds plus the step's input (the
prompt too, as mlx-lm's processors see it); a window of 0 covers all of it,
as mlx-lm's ``tokens[-0:]`` does. Strengths are cast to the logits' dtype
where mlx-lm uses a Python float, so a row rounds as it would alone; only the
frequency penalty subtracts ``count * penalty`` once where mlx-lm subtracts
``penalty`` ``count`` times (a last-bit difference in low-precision logits).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from mlxspec.engine.types import LogitsParams

if TYPE_CHECKING:
    from mlxspec.engine.sampling.grammar import GrammarProcessor

#: The penalties in mlx-lm's order: (strength field, window field).
PENALTIES = (
    ("repetition_penalty", "repetition_context_size"),
    ("presence_penalty", "presence_context_size"),
    ("frequency_penalty", "frequency_context_size"),
)


@dataclass
class _Row:
    """One row's settings and how many tokens its history holds."""

    params: LogitsParams
    grammar: GrammarProcessor | None
    seen: int  # tokens of history (KV cache contents plus the current input)

    def window(self, kind: int) -> int:
        """Tokens penalty ``kind`` looks at now (0 when it is off)."""
        strength, size = PENALTIES[kind]
        if not getattr(self.params, strength):
            return 0
        window = getattr(self.params, size)
        return self.seen if window <= 0 else min(window, self.seen)

    @property
    def need(self) -> int:
        """History width this row needs."""
        return max(self.window(k) for k in range(len(PENALTIES)))

    @property
    def penalised(self) -> bool:
        """Whether any penalty is on."""
        return any(getattr(self.params, strength) for strength, _ in PENALTIES)


class BatchLogits:
    """Logits processing for every row of a decode batch.

    Rows are appended with :meth:`extend` and dropped with :meth:`filter`, in
    step with the batch's KV cache; :meth:`__call__` processes one step's
    logits.
    """

    def __init__(self) -> None:
        self._rows: list[_Row] = []
        self._bias: Any = None  # (rows, vocab) float32, or None when no row has a bias
        self._bias_dirty = False
        self._history: Any = None  # (rows, width) int32, right-aligned; None without penalties

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def needs_host_tokens(self) -> bool:
        """Whether a row's grammar must see the last step's tokens before the
        next step's logits can be masked."""
        return any(r.grammar is not None for r in self._rows)

    def extend(
        self,
        params: Sequence[LogitsParams],
        histories: Sequence[Sequence[int]],
        grammars: Sequence[GrammarProcessor | None],
    ) -> None:
        """Append rows.

        Args:
            params (Sequence[LogitsParams]): each row's request settings.
            histories (Sequence[Sequence[int]]): the tokens each row's KV cache
                holds (the next step's input is added by :meth:`__call__`).
            grammars (Sequence[GrammarProcessor | None]): each row's grammar.
        """
        import mlx.core as mx

        new = [_Row(p, g, len(h)) for p, h, g in zip(params, histories, grammars, strict=True)]
        had, self._rows = len(self._rows), self._rows + new
        self._bias_dirty = self._bias_dirty or any(p.logit_bias for p in params)
        if self._bias is not None and not self._bias_dirty:
            zeros = mx.zeros((len(new), self._bias.shape[1]))
            self._bias = mx.concatenate([self._bias, zeros])
        if not any(r.penalised for r in self._rows):
            self._history = None
            return
        width = max(1, *(r.need for r in self._rows))
        rows = [list(h[-width:]) if r.need else [] for r, h in zip(new, histories, strict=True)]
        block = np.zeros((len(new), width), dtype=np.int32)
        for i, tokens in enumerate(rows):
            if tokens:
                block[i, width - len(tokens) :] = tokens
        old = self._history
        if old is None:
            old = mx.zeros((had, width), dtype=mx.int32)
        elif old.shape[1] < width:
            old = mx.pad(old, [(0, 0), (width - old.shape[1], 0)])
        else:
            block = np.pad(block, [(0, 0), (old.shape[1] - width, 0)])
        self._history = mx.concatenate([old, mx.array(block)])

    def filter(self, keep: Sequence[int]) -> None:
        """Keep only the rows at positions ``keep``, in that order."""
        import mlx.core as mx

        self._rows = [self._rows[i] for i in keep]
        index = mx.array(list(keep), dtype=mx.int32)
        if self._bias is not None and not self._bias_dirty:
            self._bias = self._bias[index] if keep else None
        if self._history is not None:
            self._history = self._history[index] if keep else None
            if not any(r.penalised for r in self._rows):
                self._history = None

    def __call__(self, logits: Any, inputs: Any) -> Any:
        """Process one decode step's logits.

        Args:
            logits (mx.array): shape ``(rows, vocab)``, the model's last-position logits.
            inputs (mx.array): shape ``(rows,)``, the tokens fed in this step
                (added to each row's history first, as mlx-lm's processors see them).

        Returns:
            mx.array: the processed logits, same shape and dtype.
        """
        for row in self._rows:
            row.seen += 1
        logits = self._apply_bias(logits)
        if self._history is not None:
            logits = self._apply_penalties(logits, inputs)
        if self.needs_host_tokens:
            logits = self._apply_grammars(logits)
        return logits

    def _apply_bias(self, logits: Any) -> Any:

        if self._bias_dirty:
            self._bias = _bias_matrix([r.params for r in self._rows], logits.shape[-1])
            self._bias_dirty = False
        if self._bias is None:
            return logits
        return logits + self._bias.astype(logits.dtype)

    def _apply_penalties(self, logits: Any, inputs: Any) -> Any:
        import mlx.core as mx

        width = max(r.need for r in self._rows)
        history = mx.concatenate([self._history, inputs[:, None].astype(mx.int32)], axis=1)
        if history.shape[1] < width:  # a row's need grows by at most one per step
            history = mx.pad(history, [(0, 0), (width - history.shape[1], 0)])
        self._history = history = history[:, -width:]
        rows, vocab = logits.shape
        positions = mx.arange(width)[None, :]
        row_ids = mx.broadcast_to(mx.arange(rows)[:, None], (rows, width))
        dtype = logits.dtype
        for kind, (strength, _) in enumerate(PENALTIES):
            windows = [r.window(kind) for r in self._rows]
            if not any(windows):
                continue
            inside = positions >= (width - mx.array(windows))[:, None]
            counts = mx.zeros((rows, vocab)).at[row_ids, history].add(inside.astype(mx.float32))
            seen = counts > 0
            values = [getattr(r.params, strength) or 1.0 for r in self._rows]
            penalty = mx.array(values)[:, None].astype(dtype)
            if kind == 0:  # repetition: sign-aware scaling (CTRL)
                scaled = mx.where(logits < 0, logits * penalty, logits / penalty)
                logits = mx.where(seen, scaled, logits)
            elif kind == 1:  # presence: once
                logits = mx.where(seen, logits - penalty, logits)
            else:  # frequency: per occurrence
                logits = mx.where(seen, logits - counts.astype(dtype) * penalty, logits)
        return logits

    def _apply_grammars(self, logits: Any) -> Any:
        import mlx.core as mx

        masked = [
            (i, r.grammar)
            for i, r in enumerate(self._rows)
            if r.grammar is not None and r.grammar.masking
        ]
        if not masked:
            return logits
        width = logits.shape[-1]
        allowed = np.zeros((len(masked), width), dtype=bool)
        for j, (_, grammar) in enumerate(masked):
            mask = grammar.allowed()[:width]
            allowed[j, : mask.size] = mask  # rows beyond the tokenizer are never allowed
        index = mx.array([i for i, _ in masked])
        minus_inf = mx.array(-mx.inf, dtype=logits.dtype)
        logits[index] = mx.where(mx.array(allowed), logits[index], minus_inf)
        return logits


def _bias_matrix(params: Sequence[LogitsParams], vocab: int) -> Any:
    """The ``(rows, vocab)`` float32 ``logit_bias`` matrix, or ``None`` when no
    row has a bias. Ids outside the vocabulary are skipped (mlx-lm's
    ``at[].add`` would fail on them)."""
    import mlx.core as mx

    cells = [
        (row, token, value)
        for row, p in enumerate(params)
        for token, value in p.logit_bias
        if 0 <= token < vocab
    ]
    if not cells:
        return None
    bias = mx.zeros((len(params), vocab))
    rows, tokens, values = zip(*cells, strict=True)
    bias[mx.array(rows), mx.array(tokens)] = mx.array(values)
    return bias

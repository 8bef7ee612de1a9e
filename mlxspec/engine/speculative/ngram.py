"""Prompt-lookup drafts: the tokens that followed the latest earlier occurrence
of a row's last n tokens, in the row's own prompt and answer (no draft model).

The rule of prompt lookup decoding (Saxena 2023, ``prompt-lookup-decoding``;
vLLM's ``ngram`` proposer): try the longest suffix first, from ``max_ngram``
tokens down to ``min_ngram``, and copy up to ``k`` tokens after its most recent
earlier match. Edits of a given file and summaries that quote their text repeat
long runs of the prompt, which this finds for free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxspec.engine.loop.prefill import Slot

#: Tokens searched back from the end of a row (bounds the host time per step).
WINDOW = 4096


class NgramDrafts:
    """Draft tokens by prompt lookup.

    Args:
        max_ngram (int): longest suffix matched. Default: ``4``.
        min_ngram (int): shortest suffix matched (one token matches too often
            in free text: drafts that miss cost a verify step). Default: ``2``.
    """

    kind = "ngram"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2) -> None:
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram

    def draft(
        self, rows: Sequence[Slot], ks: Sequence[int], sampler: Any
    ) -> tuple[list[list[int]], Any]:
        """Each row's lookup drafts (point masses: no probabilities)."""
        return [self.propose(slot.seq, k) for slot, k in zip(rows, ks, strict=True)], None

    def join(self, rows: Sequence[Slot]) -> None:
        """Nothing to keep per row: lookups read each row's own tokens."""

    def leave(self, keep: Sequence[int]) -> None:
        """Nothing to keep per row."""

    def settle(self, rows: Sequence[Slot], kept: Sequence[int]) -> None:
        """Nothing to keep per row."""

    def propose(self, seq: Sequence[int], k: int) -> list[int]:
        """Up to ``k`` tokens to follow ``seq``.

        Args:
            seq (Sequence[int]): the row's tokens so far (prompt, then answer).
            k (int): most tokens to propose (``<= 0`` proposes none).

        Returns:
            list[int]: the proposal, possibly empty (no earlier match).
        """
        if k <= 0:
            return []
        import numpy as np

        tail = np.asarray(seq[-WINDOW:], dtype=np.int64)
        size = len(tail)
        for n in range(min(self.max_ngram, size - 1), self.min_ngram - 1, -1):
            pattern = tail[size - n :]
            # starts p < size - n whose n tokens equal the suffix; the latest wins
            starts = np.flatnonzero(tail[: size - n] == pattern[0])
            for p in starts[::-1].tolist():
                if np.array_equal(tail[p : p + n], pattern):
                    return tail[p + n : p + n + k].tolist()
        return []

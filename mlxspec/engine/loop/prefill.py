"""Rows waiting to decode, and the prefill of joining rows in batched chunks.

A :class:`Slot` is one request in the batched decode step
(:class:`~.decode.DecodeBatch`), from its arrival to its end. Before it
decodes, its prompt (all of it but the last token, which the first decode step
feeds) is prefilled in a :class:`PrefillGroup`: a few rows that need the same
number of chunks, merged into one batch cache (mlx-lm's caches' own ``merge``),
each chunk at most ``prefill_step`` tokens of each row, right-padded where the
rows' last chunks differ in length (``prepare`` / ``finalize``, as mlx-lm's
``PromptProcessingBatch`` does). A group advances one chunk per decode step,
so running rows keep decoding and cancellation is seen between chunks; once
every row's prompt is in, the group joins the decoding rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxspec.engine.caches.kv_scheme import KvScheme
    from mlxspec.engine.loop.rows import Row
    from mlxspec.engine.sampling.batch_sampler import RowSampling


@dataclass(eq=False)
class Slot:
    """One request in a :class:`~.decode.DecodeBatch`.

    Attributes:
        row (Row): its output bookkeeping.
        seq (list[int]): every token of the sequence: what its KV cache held
            when it joined, then the rest of the prompt, then generated tokens.
        budget (int): tokens it may generate here.
        sampling (RowSampling): how it samples.
        grammar (GrammarProcessor | None): its grammar mask.
        cache (list | None): its own per-layer cache until a prefill group takes it.
        prefilled (int): tokens of ``seq`` its cache holds before it decodes.
        kv (int): tokens its KV cache holds (once decoding).
        generated (int): tokens generated here.
        started (bool): its prefill began (or it needed none).
        gone (bool): it left the batch.
        shift (int): added to its RoPE offset once it is in a batch cache
            (:attr:`.lanes.Handoff.shift`).
    """

    row: Row
    seq: list[int]
    budget: int
    sampling: RowSampling
    grammar: Any = None
    cache: list[Any] | None = None
    prefilled: int = 0
    kv: int = 0
    generated: int = 0
    started: bool = False
    gone: bool = False
    shift: int = 0

    @property
    def to_prefill(self) -> int:
        """Prompt tokens still to prefill before the last (which decodes)."""
        return len(self.seq) - 1 - self.prefilled

    @property
    def logprob_top(self) -> int | None:
        """``top_logprobs`` if it reports logprobs, else ``None``."""
        req = self.row.request
        return req.top_logprobs if req.logprobs or req.top_logprobs > 0 else None


#: ``forward(inputs (rows, L) uint32, cache, rows) -> logits``: the batch's model call.
Forward = Callable[[Any, list[Any], Sequence[Slot]], Any]


class PrefillGroup:
    """Rows prefilled together in one batch cache.

    Args:
        slots (list[Slot]): the rows, in order; their own caches (or fresh
            ones) are merged and handed over.
        model: the mlx-lm model (for fresh caches).
        step (int): most prompt tokens per row and chunk.
        kv (KvScheme | None): which layers are quantised (fresh caches and the
            merge follow it). Default: ``None`` (none).
    """

    def __init__(
        self, slots: list[Slot], model: Any, step: int, kv: KvScheme | None = None
    ) -> None:
        from mlxspec.engine.caches.kv_scheme import KvScheme  # subclasses mlx-lm's cache

        kv = kv if kv is not None else KvScheme()
        self.slots = slots
        self.step = step
        self.cache = kv.merge(
            [s.cache if s.cache is not None else kv.make_cache(model) for s in slots]
        )
        for slot in slots:
            slot.cache = None
        shifts = [s.shift for s in slots]
        if any(shifts):  # a media row's positions (mRoPE deltas): the batch cache's
            import mlx.core as mx  # per-row offset is what RoPE reads, not the mask

            delta = mx.array(shifts)
            for c in self.cache:
                c.offset = c.offset + delta

    @property
    def done(self) -> bool:
        """Every row's prompt but its last token is in the cache."""
        return all(s.to_prefill == 0 for s in self.slots)

    def advance(self, forward: Forward) -> None:
        """Queue the next chunk (``mx.async_eval``): up to :attr:`step` tokens
        of each row, right-padded to the longest."""
        import mlx.core as mx

        tails = [
            s.seq[s.prefilled : s.prefilled + min(self.step, s.to_prefill)] for s in self.slots
        ]
        lengths = [len(t) for t in tails]
        longest = max(lengths)
        if longest == 0:
            return
        padded = min(lengths) < longest
        if padded:
            for c in self.cache:
                c.prepare(lengths=lengths, right_padding=[longest - n for n in lengths])
        rows = [t + [0] * (longest - len(t)) for t in tails]
        forward(mx.array(rows, dtype=mx.uint32), self.cache, self.slots)
        if padded:
            for c in self.cache:
                c.finalize()
        mx.async_eval([c.state for c in self.cache])
        for slot, n in zip(self.slots, lengths, strict=True):
            slot.prefilled += n

    def drop_gone(self) -> bool:
        """Drop the rows that left; True when none is left."""
        keep = [i for i, s in enumerate(self.slots) if not s.gone]
        if len(keep) < len(self.slots):
            self.slots = [self.slots[i] for i in keep]
            if keep:
                for c in self.cache:
                    c.filter(keep)
        return not self.slots

    def extract(self, slot: Slot) -> tuple[list[Any], list[int]] | None:
        """A copy of ``slot`` 's cache so far and the tokens it holds."""
        if not slot.prefilled:
            return None
        i = self.slots.index(slot)
        return [c.extract(i) for c in self.cache], slot.seq[: slot.prefilled]


def take_group(waiting: deque[Slot], rows: int, step: int, tokens: int) -> list[Slot]:
    """Take the next prefill group off ``waiting``: the first row, and the
    rows after it that need as many chunks (so none waits on a longer prompt
    for chunks of its own), while the group's first chunk stays within
    ``tokens`` and its rows within ``rows``.

    Args:
        waiting (deque[Slot]): rows not started, in arrival order (changed in place).
        rows (int): most rows in the group (>= 1).
        step (int): most prompt tokens per row and chunk.
        tokens (int): most tokens in the group's first chunk.

    Returns:
        list[Slot]: the group, in arrival order (at least the first row).
    """

    def chunks(slot: Slot) -> int:
        return -(-slot.to_prefill // step)

    want = chunks(waiting[0])
    group: list[Slot] = []
    rest: deque[Slot] = deque()
    used = 0
    for slot in waiting:
        size = min(step, slot.to_prefill)
        fits = len(group) < rows and (not group or used + size <= tokens)
        if fits and chunks(slot) == want:
            group.append(slot)
            used += size
        else:
            rest.append(slot)
    waiting.clear()
    waiting.extend(rest)
    return group

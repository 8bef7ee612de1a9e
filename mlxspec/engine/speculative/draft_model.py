"""Drafts from a smaller model of the same tokenizer (``--draft-model``).

The draft model keeps its own batch KV cache
(:class:`~mlxspec.engine.caches.batch_kv.RowsKVCache`) over the speculating
rows of the decode batch, in the batch's row order: a row is prefilled into it
when it starts decoding (:meth:`DraftModel.join`), drops out with it
(:meth:`DraftModel.leave`), and after each verify step drops the drafts the
target rejected (:meth:`DraftModel.settle`). Each row's draft cache holds a
prefix of its sequence; a draft step first feeds every row the tokens it has
not seen (its last token, and the target's own token after a fully accepted
draft, or more after plain steps), right-padded to the longest and rewound per
row, then ``k - 1`` one-token steps, each row sampling its drafts with its own
settings (argmax for greedy rows; for drawn rows the draft distribution ``q``
the acceptance rule needs, as mlx-lm's ``speculative_generate_step`` does for
one sequence).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from mlxspec.engine.sampling.batch_sampler import BatchSampler

if TYPE_CHECKING:
    from mlxspec.engine.loop.prefill import Slot

#: Prompt tokens per draft prefill chunk.
DRAFT_PREFILL_STEP = 512


class DraftModel:
    """A draft model's batch of rows.

    Args:
        model: the draft mlx-lm model (same vocabulary as the target).
    """

    kind = "model"

    def __init__(self, model: Any) -> None:
        self.model = model
        self._rows: list[Slot] = []
        self._held: list[int] = []  # per row: tokens of its sequence its draft cache holds
        self._base: list[int] = []  # per row: its sequence length when it last drafted
        self._drafted = 0  # tokens drafted per row by the last draft step
        self._cache: list[Any] | None = None
        self._sampler = BatchSampler()

    @classmethod
    def load(cls, path: Path, target: Any, tokenizer: Any) -> DraftModel:
        """Load the draft folder and check it can draft for ``target``.

        Args:
            path (Path): the draft model's folder (mlx-lm format).
            target: the target model.
            tokenizer: the target's ``TokenizerWrapper``.

        Raises:
            SpeculationError: it cannot be read, its tokenizer or vocabulary
                differs from the target's, or its KV cache cannot be rewound.
        """
        from mlxspec.engine.model.cpu_weights import apply_cpu_weights
        from mlxspec.engine.model.load import load_model
        from mlxspec.engine.speculative.mount import SpeculationError, check_cache

        try:
            model, draft_tokenizer = load_model(Path(path).expanduser())
        except Exception as exc:  # mlx-lm raises many types for unreadable folders
            raise SpeculationError(f"--draft-model: cannot load {path}: {exc}") from exc
        apply_cpu_weights(model)  # as the target's: float32 where the CPU BLAS gains
        if draft_tokenizer.get_vocab() != tokenizer.get_vocab():
            raise SpeculationError(
                f"--draft-model: {path} has another tokenizer than the model "
                "(speculative decoding needs the same vocabulary)"
            )
        if _vocab_size(model) != _vocab_size(target):
            raise SpeculationError(
                f"--draft-model: {path} has {_vocab_size(model)} output logits, "
                f"the model {_vocab_size(target)}"
            )
        check_cache(model, "--draft-model")
        return cls(model)

    def join(self, rows: Sequence[Slot]) -> None:
        """Prefill the speculating ``rows`` (all of each sequence but its last
        token) into the draft cache, appended in order."""
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        from mlxspec.engine.caches.batch_kv import merge_rows

        new = [s for s in rows if s.row.spec is not None and len(s.seq) > 1]
        if not new:
            return
        caches = []
        for slot in new:
            cache = make_prompt_cache(self.model)
            head = mx.array(slot.seq[:-1], dtype=mx.uint32)[None]
            for start in range(0, head.shape[1], DRAFT_PREFILL_STEP):
                self.model(head[:, start : start + DRAFT_PREFILL_STEP], cache=cache)
                mx.eval([c.state for c in cache])
            caches.append(cache)
        merged = merge_rows(caches)
        if self._cache is None:
            self._cache = merged
        else:
            for mine, theirs in zip(self._cache, merged, strict=True):
                mine.extend(theirs)
        self._rows.extend(new)
        self._held.extend(len(s.seq) - 1 for s in new)
        self._base.extend(len(s.seq) for s in new)
        self._sampler.extend([s.sampling for s in new])

    def leave(self, keep: Sequence[int]) -> None:
        """Drop the rows that left the batch (their slots are marked gone)."""
        stay = [i for i, s in enumerate(self._rows) if not s.gone]
        if len(stay) == len(self._rows):
            return
        if not stay:
            self._rows, self._held, self._base, self._cache = [], [], [], None
            self._sampler = BatchSampler()
            return
        assert self._cache is not None
        for c in self._cache:
            c.filter(stay)
        self._rows = [self._rows[i] for i in stay]
        self._held = [self._held[i] for i in stay]
        self._base = [self._base[i] for i in stay]
        self._sampler.filter(stay)

    def draft(
        self, rows: Sequence[Slot], ks: Sequence[int], sampler: Any
    ) -> tuple[list[list[int]], Any]:
        """Draft ``max(ks)`` tokens for every speculating row in one batch.

        Args:
            rows (Sequence[Slot]): the decode batch's rows, in order.
            ks (Sequence[int]): most drafts each row takes.
            sampler: the decode batch's sampler (unused: the draft batch keeps
                its rows' settings).

        Returns:
            tuple: ``(drafts, q)``: per row its drafts (``[]`` for rows not
            drafting); ``q`` shape ``(rows, k, vocab)``, the draft
            probabilities, when a drafting row samples (else ``None``).
        """
        import mlx.core as mx

        where = {id(s): j for j, s in enumerate(self._rows)}
        k = max((kk for s, kk in zip(rows, ks, strict=True) if id(s) in where), default=0)
        if k == 0 or self._cache is None:
            return [[] for _ in rows], None
        pending = [s.seq[h:] for s, h in zip(self._rows, self._held, strict=True)]
        width = max(len(p) for p in pending)
        fed = mx.array([[*p, *([0] * (width - len(p)))] for p in pending], dtype=mx.uint32)
        logits = self.model(fed, cache=self._cache)
        last = mx.array([len(p) - 1 for p in pending], dtype=mx.int32)
        logits = mx.take_along_axis(logits, last[:, None, None], axis=1)[:, 0, :]
        for c in self._cache:
            c.rewind([width - len(p) for p in pending])
        self._base = [len(s.seq) for s in self._rows]
        tokens, probs = [], []
        for step in range(k):
            logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            token = self._sampler(logprobs)
            scaled, _ = self._sampler.scaled(logprobs[:, None])
            if scaled is not None:
                probs.append(mx.softmax(scaled[:, 0].astype(mx.float32), axis=-1))
            tokens.append(token)
            if step < k - 1:
                logits = self.model(token[:, None], cache=self._cache)[:, -1, :]
        self._drafted = k
        drafted = mx.stack(tokens, axis=1)
        q = mx.stack(probs, axis=1) if probs else None
        mx.eval(drafted, *([q] if q is not None else []))
        table = cast(list[list[int]], drafted.tolist())
        drafts = [
            table[where[id(s)]][:kk] if id(s) in where else []
            for s, kk in zip(rows, ks, strict=True)
        ]
        if q is not None:
            index = mx.array([where.get(id(s), 0) for s in rows], dtype=mx.int32)
            q = q[index]
        return drafts, q

    def settle(self, rows: Sequence[Slot], kept: Sequence[int]) -> None:
        """Drop the draft cache's positions past each row's accepted drafts."""
        if self._cache is None or not self._drafted:
            return
        accepted = {id(s): n - 1 for s, n in zip(rows, kept, strict=True)}
        k = self._drafted
        counts = []
        for j, slot in enumerate(self._rows):
            good = min(accepted.get(id(slot), 0), k - 1)
            counts.append(k - 1 - good)
            self._held[j] = self._base[j] + good
        for c in self._cache:
            c.rewind(counts)
        self._drafted = 0


def _vocab_size(model: Any) -> int | None:
    """The model's output vocabulary (``args.vocab_size``), ``None`` if unknown."""
    args = getattr(model, "args", None)
    return getattr(args, "vocab_size", None)

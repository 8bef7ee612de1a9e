"""Continuous batching on mlx-lm's ``BatchGenerator`` (engine thread only).

Requests join the running batch between decode steps and leave it when they
finish or are cancelled; each keeps its own sampler, logits processors and
token budget (``BatchGenerator.insert``'s per-sequence options). Output
bookkeeping is the same :class:`~.rows.Row` the serial lane uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .grammar import GrammarCache
from .rows import Row
from .sampling import build_logits_processors, build_sampler
from .types import Failed

if TYPE_CHECKING:
    from .generator import RequestHandle


class BatchLane:
    """A running batch of requests.

    Args:
        model: the mlx-lm model.
        tokenizer: its ``TokenizerWrapper``.
        eos (set[int]): end-of-sequence ids (also the batch's stop tokens).
        xtc_special (list[int]): tokens XTC never removes.
        max_batch (int): most sequences decoding at once.
        on_done (Callable[[str], None]): called with ``"completed"`` or
            ``"cancelled"`` when a request leaves the batch.
        prefill_step (int): prompt tokens per prefill chunk; each ``step``
            processes at most one chunk, so cancellation is seen between chunks.
            Default: ``2048`` (mlx-lm's).
        grammars (GrammarCache | None): compiles requests' constraints into
            per-row processors; ``None`` ignores constraints. Default: ``None``.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        eos: set[int],
        xtc_special: list[int],
        max_batch: int,
        on_done: Callable[[str], None],
        prefill_step: int = 2048,
        grammars: GrammarCache | None = None,
    ) -> None:
        from mlx_lm.generate import BatchGenerator

        self._tokenizer = tokenizer
        self._eos = eos
        self._xtc_special = xtc_special
        self._on_done = on_done
        self._grammars = grammars
        self._gen = BatchGenerator(
            model,
            stop_tokens=[[t] for t in sorted(eos)],
            completion_batch_size=max_batch,
            prefill_batch_size=min(max_batch, 8),
            prefill_step_size=prefill_step,
        )
        self._rows: dict[int, Row] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, handle: RequestHandle, max_tokens: int) -> None:
        """Queue ``handle``'s request into the batch with a budget of ``max_tokens`` (>= 1)."""
        req = handle.request
        grammar = None if self._grammars is None else self._grammars.for_request(req.constraint)
        # The grammar mask goes last: after penalties and logit_bias.
        processors = build_logits_processors(req.logits) + ([grammar] if grammar else [])
        (uid,) = self._gen.insert(
            [list(req.prompt)],
            max_tokens=[max_tokens],
            samplers=[build_sampler(req.sampling, self._xtc_special)],
            logits_processors=[processors],
        )
        self._rows[uid] = Row(handle, self._tokenizer, self._eos, lane="batched", grammar=grammar)

    def step(self) -> None:
        """Drop cancelled requests, then run one prefill/decode step and route its tokens."""
        gone = [uid for uid, row in self._rows.items() if row.handle.cancelled]
        if gone:
            self._gen.remove(gone)
            for uid in gone:
                del self._rows[uid]
                self._on_done("cancelled")
        if not self._rows:
            return
        _, responses = self._gen.next()
        finished = []
        for r in responses:
            row = self._rows.get(r.uid)
            if row is None:
                continue
            ended = row.push(r.token, r.logprobs)
            if not ended and r.finish_reason is not None:
                row.finish_length()
                ended = True
            if ended:
                finished.append(r.uid)
        if finished:  # rows ended by a stop string are still in the generator
            self._gen.remove(finished)
        for uid in finished:
            del self._rows[uid]
            self._on_done("completed")

    def fail_all(self, message: str) -> int:
        """Fail every request in the batch with ``message``; returns how many."""
        for row in self._rows.values():
            row.handle.emit(Failed(message))
        failed = len(self._rows)
        self._rows.clear()
        return failed

    def close(self) -> None:
        """Release the generator (wired-memory limit) and cancel what is left."""
        for row in self._rows.values():
            row.handle.cancel()
        self._rows.clear()
        self._gen.close()

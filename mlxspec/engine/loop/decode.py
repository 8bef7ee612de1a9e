"""The batched decode step, owned by mlxspec (engine thread only).

mlx-lm's ``BatchGenerator`` spent most of a batched step around the model call
at 32-64 rows (H200, 7.4B: ~30 and ~54 ms a step against the model's 11 and 15
ms, ``benchmarks/README.md``): each row's logits processors and sampler on its
own slice, a list of per-row log-probability arrays, token contexts copied per
row. :class:`DecodeBatch` keeps mlx-lm's model code, its KV caches (merged and
filtered by their own methods, :mod:`~mlxspec.engine.caches.batch_kv`) and its
sampling functions, and owns the loop around them:

- the step's logits processors run once over ``(rows, vocab)``
  (:class:`~mlxspec.engine.sampling.batch_logits.BatchLogits`) and one call
  samples every row (:class:`~mlxspec.engine.sampling.batch_sampler.BatchSampler`);
  logprobs of the rows that report them are picked in the same graph;
- one host read per step: step ``t + 1`` is built and queued
  (``mx.async_eval``) from step ``t``'s tokens before those are read, as
  mlx-lm's ``generate_step`` pipelines one sequence. A batch holding a grammar
  row reads first and builds after, since xgrammar's matcher must see the
  token before it masks the next one;
- rows joining are prefilled between decode steps, a chunk of at most
  ``prefill_step`` tokens per row and step, several rows at once
  (:class:`~.prefill.PrefillGroup`), so running rows keep decoding meanwhile;
- the model is called in one place, :meth:`DecodeBatch.forward`, for decode
  and prefill alike, inside the batch's ``select`` context given that call's
  rows: the LoRA adapters' per-row selection (:meth:`.lanes.LaneParts.rows`);
- with a ``speculator`` (:mod:`~mlxspec.engine.speculative`), a step whose rows
  have drafts is a verify step (:func:`.verify_step.verify_step`): every row
  feeds its last token and its drafts at once, keeps what the speculator
  accepts, and its KV cache drops the rest; a step without drafts is a plain one.

What the KV cache holds: a row's cache holds every token fed to the model for
it. A decode step feeds each row its last token, so once step ``t + 1`` is
queued the cache holds the row's tokens through ``t``; :attr:`Slot.kv` counts
them and :meth:`DecodeBatch.extract` hands out exactly those.
"""

from __future__ import annotations

import contextlib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlxspec.engine.loop.prefill import PrefillGroup, Slot, take_group
from mlxspec.engine.loop.rows import StepLogprobs
from mlxspec.engine.loop.verify_step import verify_step
from mlxspec.engine.sampling.batch_logits import BatchLogits
from mlxspec.engine.sampling.batch_sampler import (
    BatchSampler,
    LogprobPlan,
    RowSampling,
    logprob_rows,
)

if TYPE_CHECKING:
    from mlxspec.engine.caches.kv_scheme import KvScheme
    from mlxspec.engine.loop.lanes import Handoff
    from mlxspec.engine.speculative import Speculator

#: Decode steps between returns of MLX's freed buffers (``generate_step``: 256).
CLEAR_EVERY = 256


@dataclass(frozen=True)
class Token:
    """One row's token from one step.

    Attributes:
        slot (Slot): the row.
        id (int): the token.
        logprobs (StepLogprobs | None): its log-probability and candidates,
            when the row reports them.
        count (int): the row's tokens generated here, this one included (a
            verify step hands a row several tokens at once).
    """

    slot: Slot
    id: int
    logprobs: StepLogprobs | None
    count: int = 0


@dataclass
class _Launched:
    """A decode step queued on the device, not read yet."""

    rows: list[Slot]
    tokens: Any
    extras: tuple[Any, ...]
    plan: LogprobPlan

    def read(self) -> list[Token]:
        """Read the step's tokens (the host sync) and its rows' logprobs."""
        ids = self.tokens.tolist()
        lps: dict[int, StepLogprobs] = {}
        if self.extras:
            values, top_ids, top_values = self.extras
            vals = values.tolist()
            tids = top_ids.tolist() if top_ids is not None else [[] for _ in vals]
            tvals = top_values.tolist() if top_values is not None else [[] for _ in vals]
            for j, i in enumerate(self.plan.rows):
                lps[i] = StepLogprobs(vals[j], tids[j], tvals[j])
        out = []
        for i, slot in enumerate(self.rows):
            if not slot.gone:
                slot.seq.append(ids[i])
                slot.generated += 1
                out.append(Token(slot, ids[i], lps.get(i), slot.generated))
        return out


@dataclass
class StepClock:
    """Where the batch's steps spent host time (seconds, since start).

    Attributes:
        build_s (float): building and queueing decode steps.
        prefill_s (float): building and queueing prefill chunks and joins.
        read_s (float): waiting for and reading tokens (the host sync).
        steps (int): decode steps queued.
    """

    build_s: float = 0.0
    prefill_s: float = 0.0
    read_s: float = 0.0
    steps: int = 0


class DecodeBatch:
    """Rows decoding together, one token each per :meth:`step`.

    Args:
        model: the mlx-lm model.
        prefill_step (int): most prompt tokens a row prefills per step.
        max_rows (int): most rows decoding at once; more wait for a free row.
        prefill_rows (int): a prefill chunk holds at most ``prefill_rows *
            prefill_step`` tokens (mlx-lm's ``BatchGenerator``: 8 rows of a
            chunk each): 8 long prompts, or more short ones. Default: ``8``.
        select (Callable | None): given the rows of a model call, the context
            the call runs in (the rows' adapters, :meth:`.lanes.LaneParts.rows`).
            Default: ``None`` (none).
        speculator (Speculator | None): drafts for the rows that speculate and
            the verdict of their verify steps (:mod:`~mlxspec.engine.speculative`).
            Default: ``None`` (a token per row and step).
        kv (KvScheme | None): which layers keep K/V quantised: the batch makes,
            merges, joins and converts its caches through it
            (:mod:`~mlxspec.engine.caches.kv_scheme`). Default: ``None`` (none).
    """

    def __init__(
        self,
        model: Any,
        prefill_step: int,
        max_rows: int,
        prefill_rows: int = 8,
        select: Callable[[Sequence[Slot]], AbstractContextManager[None]] | None = None,
        speculator: Speculator | None = None,
        kv: KvScheme | None = None,
    ):
        from mlxspec.engine.caches import rows_attention
        from mlxspec.engine.caches.kv_scheme import KvScheme

        self._model = model
        self._select = select
        self._spec = speculator
        self._kv = kv if kv is not None else KvScheme()
        #: Whether padded rows' decode attention skips the mask (CUDA, :mod:`.rows_attention`).
        self.rows_attention = rows_attention.install(model)
        self.prefill_step = prefill_step
        self.max_rows = max_rows
        self.prefill_tokens = max(1, prefill_rows) * prefill_step
        self._rows: list[Slot] = []  # decoding, in the cache's row order
        self._group: PrefillGroup | None = None  # being prefilled
        self._waiting: deque[Slot] = deque()  # not started, in arrival order
        self._cache: list[Any] | None = None
        self._inputs: Any = None  # (rows,) the tokens the next step feeds
        self._logits = BatchLogits()
        self._sampler = BatchSampler()
        self._plan = LogprobPlan((), ())
        self._inflight: deque[_Launched] = deque()
        self.clock = StepClock()

    def __len__(self) -> int:
        return len(self.slots)

    @property
    def slots(self) -> list[Slot]:
        """Every row: decoding, being prefilled, waiting."""
        group = self._group.slots if self._group is not None else []
        return [*self._rows, *group, *self._waiting]

    def add(self, handoff: Handoff) -> Slot:
        """Queue a request (:class:`~.lanes.Handoff`): its cache holds ``held``,
        ``feed`` is still to feed; it decodes once prefilled.

        Returns:
            Slot: the request's row here.
        """
        req = handoff.row.request
        slot = Slot(
            row=handoff.row,
            seq=[*handoff.held, *handoff.feed],
            budget=handoff.max_tokens,
            sampling=RowSampling.of(req.sampling, handoff.sampler),
            grammar=handoff.grammar,
            cache=handoff.cache,
            prefilled=len(handoff.held),
            shift=handoff.shift,
        )
        self._waiting.append(slot)
        return slot

    def forward(self, inputs: Any, cache: list[Any], rows: Sequence[Slot]) -> Any:
        """The model call of every decode step and prefill chunk (the one place
        the model runs, so a per-row hook can wrap it).

        Args:
            inputs (mx.array): shape ``(len(rows), L)``, ``uint32`` token ids.
            cache (list): per-layer caches holding ``rows``, in that order.
            rows (Sequence[Slot]): the rows of ``inputs``.

        Returns:
            mx.array: logits, shape ``(len(rows), L, vocab)``.
        """
        with self._select(rows) if self._select is not None else contextlib.nullcontext():
            return self._model(inputs, cache=cache)

    @property
    def prefill_waiting(self) -> bool:
        """A prefill chunk is due: a group under way, or rows waiting and a row free."""
        return self._group is not None or (bool(self._waiting) and len(self._rows) < self.max_rows)

    def step(self, route: Callable[[list[Token]], None], prefill: bool = True) -> list[Slot]:
        """Queue one decode step (and a prefill chunk for rows waiting), and
        hand the tokens of the step before it to ``route``.

        Args:
            route (Callable[[list[Token]], None]): gets each step's tokens,
                in row order; it may :meth:`remove` rows.
            prefill (bool): queue a prefill chunk too (false when the step's
                caller ran one of its own, a media prefill). Default: ``True``.

        Returns:
            list[Slot]: rows whose prefill began in this step.
        """
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        with mx.stream(generation_stream):
            if self._cache is not None:
                self._kv.settle(self._cache)  # --quantized-kv-start passed
            advance: Callable[[], list[Slot]] = self._prefill if prefill else lambda: []
            if self._spec is not None and self._rows and self._spec.wants(self._rows):
                self._read(route, keep=0)  # drafts come from the tokens read so far
                if self._rows and verify_step(self, self._spec, route):
                    return advance()
            if self._logits.needs_host_tokens:  # a grammar sees token t before masking t + 1
                self._read(route, keep=0)
                self._launch()
                return advance()
            launched = self._launch()
            began = advance()
            self._read(route, keep=1 if launched else 0)
            return began

    def remove(self, slots: Iterable[Slot]) -> None:
        """Drop rows (finished or cancelled) from the batch; their tokens still
        in flight are never handed out."""
        import mlx.core as mx

        slots = list(slots)
        if self._spec is not None:  # their step in flight decodes nothing for them
            pending = {id(s) for launched in self._inflight for s in launched.rows}
            self._spec.wasted([s for s in slots if id(s) in pending and not s.gone])
        for slot in slots:
            slot.gone = True
        self._waiting = deque(s for s in self._waiting if not s.gone)
        if self._group is not None and self._group.drop_gone():
            self._group = None
        keep = [i for i, s in enumerate(self._rows) if not s.gone]
        if len(keep) == len(self._rows):
            return
        if self._spec is not None:
            self._spec.leave(keep)
        self._rows = [self._rows[i] for i in keep]
        if not keep:
            self._cache, self._inputs = None, None
            self._logits, self._sampler = BatchLogits(), BatchSampler()
        else:
            assert self._cache is not None
            for c in self._cache:
                c.filter(keep)
            self._inputs = self._inputs[mx.array(keep, dtype=mx.int32)]
            self._logits.filter(keep)
            self._sampler.filter(keep)
        self._plan = LogprobPlan.of([s.logprob_top for s in self._rows])

    def clear(self) -> list[Slot]:
        """Drop every row without touching MLX (after a failed step, or at
        close); returns them."""
        slots = self.slots
        for slot in slots:
            slot.gone = True
        self._rows, self._waiting, self._inflight = [], deque(), deque()
        self._group, self._cache, self._inputs = None, None, None
        self._logits, self._sampler = BatchLogits(), BatchSampler()
        self._plan = LogprobPlan((), ())
        if self._spec is not None:
            self._spec.leave([])
        return slots

    def extract(self, slot: Slot) -> tuple[list[Any], list[int]] | None:
        """A copy of ``slot`` 's KV cache and the tokens it holds (for the
        prompt cache), or ``None`` when it holds nothing yet."""
        if slot in self._rows and self._cache is not None:
            i = self._rows.index(slot)
            return [c.extract(i) for c in self._cache], slot.seq[: slot.kv]
        if self._group is not None and slot in self._group.slots:
            return self._group.extract(slot)
        if slot.cache is not None and slot.prefilled:
            return slot.cache, slot.seq[: slot.prefilled]
        return None

    def _launch(self) -> bool:
        """Build and queue a decode step of every decoding row; False if none."""
        import time

        import mlx.core as mx

        if not self._rows:
            return False
        start = time.perf_counter()
        assert self._cache is not None
        inputs = self._inputs
        logits = self.forward(inputs[:, None], self._cache, self._rows)[:, -1, :]
        logits = self._logits(logits, inputs)
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        tokens = self._sampler(logprobs)
        extras = logprob_rows(logprobs, tokens, self._plan)
        mx.async_eval(tokens, *(e for e in extras if e is not None))
        if self._spec is not None:
            self._spec.launched(self._rows)
        for slot in self._rows:
            slot.kv += 1
        self._inputs = tokens
        self._inflight.append(_Launched(list(self._rows), tokens, extras, self._plan))
        self.clock.steps += 1
        if self.clock.steps % CLEAR_EVERY == 0:
            mx.clear_cache()
        self.clock.build_s += time.perf_counter() - start
        return True

    def _read(self, route: Callable[[list[Token]], None], keep: int) -> None:
        """Read the queued steps but the ``keep`` newest and route their tokens."""
        import time

        while len(self._inflight) > keep:
            launched = self._inflight.popleft()
            if all(slot.gone for slot in launched.rows):
                continue  # nobody left to read it for
            start = time.perf_counter()
            tokens = launched.read()
            self.clock.read_s += time.perf_counter() - start
            route(tokens)

    def _prefill(self) -> list[Slot]:
        """Advance the prefill by one chunk, if a row is free: the group under
        way, or a new one from the rows waiting; a group whose prompts are in
        joins the decoding rows.

        Returns:
            list[Slot]: rows whose prefill began here.
        """
        import time

        start = time.perf_counter()
        room = self.max_rows - len(self._rows)
        began: list[Slot] = []
        if self._group is None:
            if not self._waiting or room <= 0:
                return []
            rows = take_group(self._waiting, room, self.prefill_step, self.prefill_tokens)
            self._group = PrefillGroup(rows, self._model, self.prefill_step, self._kv)
            began = rows
            for slot in rows:
                slot.started = True
        self._group.advance(self.forward)
        if self._group.done:
            self._join(self._group)
            self._group = None
        self.clock.prefill_s += time.perf_counter() - start
        return began

    def _join(self, group: PrefillGroup) -> None:
        """Make ``group`` 's rows decoding: its cache joins the batch's (both
        right-aligned), and the next step feeds each row its last prompt token."""
        import mlx.core as mx

        rows = group.slots
        firsts = mx.array([s.seq[-1] for s in rows], dtype=mx.uint32)
        if self._cache is None:
            self._cache, self._inputs = group.cache, firsts
        else:
            self._kv.extend(self._cache, group.cache)
            self._inputs = mx.concatenate([self._inputs, firsts])
        for slot in rows:
            slot.kv = slot.prefilled
        self._logits.extend(
            [s.row.request.logits for s in rows],
            [s.seq[:-1] for s in rows],
            [s.grammar for s in rows],
        )
        self._sampler.extend([s.sampling for s in rows])
        if self._spec is not None:
            self._spec.join(rows)
        self._rows.extend(rows)
        self._plan = LogprobPlan.of([s.logprob_top for s in self._rows])

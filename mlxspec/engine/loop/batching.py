"""Continuous batching on mlx-lm's ``BatchGenerator`` (engine thread only).

Requests join the running batch between decode steps and leave it when they
finish or are cancelled; each keeps its own sampler, logits processors and
token budget (``BatchGenerator.insert``'s per-sequence options). Output
bookkeeping is the same :class:`~.rows.Row` the serial lane uses. A request
that began decoding alone (:mod:`.solo`) joins mid-generation through
:meth:`BatchLane.adopt`.

With a :class:`~.prompt_cache.PromptCache`, a request joins with a copy of the
best kept KV cache and only its uncached prompt tail (``insert``'s ``caches``
and ``all_tokens``, as ``mlx_lm.server`` does); when it leaves, its KV cache
(prompt plus generated tokens) is kept for later requests.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mlxspec.engine.adapters.batch_rows import RowsModel
from mlxspec.engine.adapters.registry import NO_ADAPTER, AdapterPick
from mlxspec.engine.loop.handles import flush_wakeups
from mlxspec.engine.loop.lanes import Handoff, LaneParts, StepTimes, start_request
from mlxspec.engine.loop.rows import Row
from mlxspec.engine.types import Failed

if TYPE_CHECKING:
    from mlxspec.engine.loop.handles import RequestHandle


class BatchLane:
    """A running batch of requests.

    Args:
        parts (LaneParts): model, tokenizer, stop tokens, prompt cache and
            grammar compiler of the engine; ``parts.prefill_step`` prompt tokens
            are prefilled per :meth:`step`, so cancellation is seen between chunks.
        max_batch (int): most sequences decoding at once.
        on_done (Callable[[RequestHandle, str], None]): called with the
            request's handle and ``"completed"``, ``"cancelled"`` or
            ``"failed"`` when it leaves the batch (not on :meth:`close`).
        times (StepTimes | None): where step times add up (the engine keeps one
            across lanes). Default: ``None`` (a lane-own one).
    """

    def __init__(
        self,
        parts: LaneParts,
        max_batch: int,
        on_done: Callable[[RequestHandle, str], None],
        times: StepTimes | None = None,
    ) -> None:
        from mlx_lm.generate import BatchGenerator

        self._parts = parts
        self._on_done = on_done
        self.times = StepTimes() if times is None else times
        self._rows: dict[int, Row] = {}
        model = parts.model
        if parts.adapters is not None:  # each call selects its rows' adapters
            model = RowsModel(model, parts.adapters, self._pick_of)
        self._gen = BatchGenerator(
            model,
            stop_tokens=[[t] for t in sorted(parts.eos)],
            completion_batch_size=max_batch,
            prefill_batch_size=min(max_batch, 8),
            prefill_step_size=parts.prefill_step,
        )
        #: Rows whose request has not started: mlx-lm's generator holds a row
        #: beyond its ``completion_batch_size`` until one leaves, and the request's
        #: ``started_at`` (the end of its queue time) is its first prefill step.
        self._unstarted: set[int] = set()
        self._cache = parts.prompt_cache

    def __len__(self) -> int:
        return len(self._rows)

    def add(self, handle: RequestHandle, max_tokens: int) -> None:
        """Queue ``handle``'s request into the batch with a budget of ``max_tokens`` (>= 1)."""
        req = handle.request
        if req.shared_prefill:
            self._prefill_once(req.prompt, req.session, self._parts.pick(handle, lease=False))
        self.adopt(start_request(handle, self._parts, max_tokens, "batched"))

    def adopt(self, handoff: Handoff) -> None:
        """Continue a request in the batch: a new one (:meth:`add`) or one that
        decoded alone so far (:meth:`~.solo.SoloRun.handoff`), whose row keeps
        its count, text and stop-string state.

        Raises:
            ValueError: ``BatchGenerator.insert`` rejected the row's options.
        """
        (uid,) = self._gen.insert(
            [handoff.feed],
            max_tokens=[handoff.max_tokens],
            caches=[handoff.cache],
            all_tokens=[handoff.held],
            samplers=[handoff.sampler],
            logits_processors=[handoff.chain],
        )
        self._rows[uid] = handoff.row
        if handoff.row.handle.started_at is None:
            self._unstarted.add(uid)

    def _forget(self, uid: int) -> RequestHandle:
        """Drop row ``uid``; returns its request's handle."""
        self._unstarted.discard(uid)
        return self._rows.pop(uid).handle

    def _pick_of(self, uid: int) -> AdapterPick:
        """Row ``uid``'s adapters (the base model for a row that has left)."""
        row = self._rows.get(uid)
        return row.pick if row is not None else NO_ADAPTER

    def _prefill_once(
        self, prompt: tuple[int, ...], session: str | None, pick: AdapterPick
    ) -> None:
        """Keep the KV cache of ``prompt[:-1]`` in the prompt cache unless it is
        there already, so the ``n`` sibling requests of one body prefill the
        prompt once and each starts from a copy (their ``fetch`` hits it).

        Runs the prefill here, in ``prefill_step`` chunks (mlx-lm's model call
        with a ``make_prompt_cache`` cache); a cache too large for the budget is
        not kept, and each sibling then prefills as usual.
        """
        import mlx.core as mx
        from mlx_lm.models.cache import make_prompt_cache

        head = prompt[:-1]
        namespace = self._parts.namespace_of(pick)  # the KV of these adapters' weights
        if len(head) < 2 or self._cache.covered(namespace, prompt) >= len(head):
            return
        cache = make_prompt_cache(self._parts.model)
        tokens = mx.array(head, dtype=mx.uint32)[None]
        step = self._parts.prefill_step
        with self._parts.rows([pick]):
            for start in range(0, len(head), step):
                self._parts.model(tokens[:, start : start + step], cache=cache)
                mx.eval([c.state for c in cache])
        self._cache.store(namespace, head, cache, session)

    def step(self) -> None:
        """Drop cancelled requests, then run one prefill/decode step and route its tokens."""
        gone = [uid for uid, row in self._rows.items() if row.handle.cancelled]
        if gone:
            self._keep(self._gen.remove(gone, return_prompt_caches=self._cache.enabled))
            for uid in gone:
                self._on_done(self._forget(uid), "cancelled")
        if not self._rows:
            return
        began, start = time.monotonic(), time.perf_counter()
        prompts, responses = self._gen.next()
        routed = time.perf_counter()
        if self._unstarted:
            self._mark_started(prompts, responses, began)
        self._route(responses)
        self.times.add(len(responses), routed - start, time.perf_counter() - routed)

    def _mark_started(self, prompts: list[Any], responses: list[Any], began: float) -> None:
        """Set ``started_at`` to ``began`` (the step's start, ``time.monotonic()``)
        on the requests whose rows appear in the step for the first time (a
        prefill chunk, or a token for a row adopted with no prompt to prefill)."""
        for r in (*prompts, *responses):
            if r.uid in self._unstarted:
                self._unstarted.discard(r.uid)
                self._rows[r.uid].handle.started_at = began

    def _route(self, responses: list[Any]) -> None:
        """Hand each response's token to its row; remove the rows that ended."""
        finished = []
        for r in responses:
            row = self._rows.get(r.uid)
            if row is None:
                continue
            if self._cache.enabled:
                row.before_finish = lambda r=r: self._keep_finished(r)
            ended = row.push(r.token, r.logprobs)
            if not ended and r.finish_reason is not None:
                row.finish_length()
                ended = True
            if ended:
                finished.append(r.uid)
        if finished:  # rows ended by a stop string are still in the generator
            flush_wakeups()  # the rows served so far need not wait for the removal
            self._gen.remove(finished)
        for uid in finished:
            self._on_done(self._forget(uid), "completed")

    def _keep_finished(self, r: Any) -> None:
        """Keep the KV cache of the row ending at response ``r``: the generator
        hands it over when it ended the row itself, else the row is removed
        now (a stop string or EOS matched on our side)."""
        flush_wakeups()  # the rows served so far need not wait for the keep
        if r.finish_reason is not None:
            self._keep({r.uid: (r.prompt_cache, r.all_tokens)})
        else:
            self._keep(self._gen.remove([r.uid], return_prompt_caches=True))

    def _keep(self, caches: dict[int, tuple[list[Any], list[int]]]) -> None:
        """Hand leaving rows' KV caches (``uid -> (cache, tokens it holds)``)
        to the prompt cache, under each request's session."""
        for uid, (cache, tokens) in caches.items():
            row = self._rows.get(uid)
            if row is not None:  # a row that left unseen has no namespace to keep it in
                self._parts.keep(tokens, cache, row.request.session, row.pick)

    def fail_all(self, message: str) -> int:
        """Fail every request in the batch with ``message`` (each ends through
        ``on_done``); returns how many."""
        rows = list(self._rows.values())
        self._rows.clear()
        self._unstarted.clear()
        for row in rows:
            row.handle.emit(Failed(message))
            self._on_done(row.handle, "failed")
        return len(rows)

    def close(self) -> None:
        """Release the generator (wired-memory limit) and cancel what is left."""
        for row in self._rows.values():
            row.handle.cancel()
        self._rows.clear()
        self._unstarted.clear()
        self._gen.close()

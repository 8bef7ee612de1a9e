"""Continuous batching on mlxspec's own decode step (engine thread only).

Requests join the running batch between decode steps and leave it when they
finish or are cancelled; each keeps its own sampler settings, logits processors
and token budget, and :class:`~.decode.DecodeBatch` applies them to all rows
at once, one host read per step. Output bookkeeping is the same
:class:`~.rows.Row` the serial lane uses. A request that began decoding alone
(:mod:`.solo`) joins mid-generation through :meth:`BatchLane.adopt`.

With a :class:`~.prompt_cache.PromptCache`, a request joins with a copy of the
best kept KV cache and only its uncached prompt tail (as ``mlx_lm.server``
does); when it leaves, its KV cache (prompt plus generated tokens) is kept for
later requests.

A request with media is prefilled on the vision wing first
(:class:`~.media_prefill.MediaPrefill`, one embedding or chunk per
:meth:`BatchLane.step`, in arrival order), then joins the batch like any row;
a step that advanced a media prefill queues no prefill chunk of the batch's
own, so running rows wait at most one chunk between two tokens. Its KV cache
is kept, and found, under the media's digest (``CacheNamespace.media``: token
ids alone do not say which image they stood for).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from mlxspec.engine.adapters.registry import AdapterPick
from mlxspec.engine.loop.decode import DecodeBatch, Slot, Token
from mlxspec.engine.loop.handles import flush_wakeups
from mlxspec.engine.loop.lanes import Handoff, LaneParts, StepTimes, start_request
from mlxspec.engine.loop.media_prefill import MediaPrefill
from mlxspec.engine.types import Failed

log = logging.getLogger("mlxspec.engine")

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
        from mlx_lm.utils import maybe_set_recommended_wired_limit

        self._parts = parts
        self._on_done = on_done
        self.times = StepTimes() if times is None else times
        #: The decode step; rows beyond ``max_batch`` wait there, unstarted,
        #: until one leaves (a request's ``started_at``, the end of its queue
        #: time, is its first prefill step).
        self.batch = DecodeBatch(
            parts.model,
            parts.prefill_step,
            max_batch,
            prefill_rows=min(max_batch, parts.prefill_batch),
            # every model call of the batch selects its rows' adapters
            select=lambda slots: parts.rows([s.row.pick for s in slots]),
            speculator=parts.speculator,
            kv=parts.kv,
        )
        self._cache = parts.prompt_cache
        #: Requests with media whose prompts the vision wing prefills, in order.
        self.media: deque[MediaPrefill] = deque()
        self._media_turn = True  # media and the batch's own prefill take turns
        self._route_s, self._routed = 0.0, 0  # this step's routing time and tokens
        self._old_wired_limit = maybe_set_recommended_wired_limit()  # Metal only

    def __len__(self) -> int:
        return len(self.batch) + len(self.media)

    def add(self, handle: RequestHandle, max_tokens: int) -> None:
        """Queue ``handle``'s request into the batch with a budget of ``max_tokens``
        (>= 1); a request with media is prefilled on the vision wing first."""
        req = handle.request
        # at --batch 1 only speculating and media requests come here, each alone: the serial lane
        lane = "batched" if self.batch.max_rows > 1 else "serial"
        if req.media is not None:
            self.media.append(MediaPrefill(handle, self._parts, max_tokens, lane))
            return
        if req.shared_prefill:
            self._prefill_once(req.prompt, req.session, self._parts.pick(handle, lease=False))
        self.adopt(start_request(handle, self._parts, max_tokens, lane))

    def adopt(self, handoff: Handoff) -> None:
        """Continue a request in the batch: a new one (:meth:`add`) or one that
        decoded alone so far (:meth:`~.solo.SoloRun.handoff`), whose row keeps
        its count, text and stop-string state."""
        slot = self.batch.add(handoff)
        if self._cache.enabled:  # the KV cache is kept before Finished goes out
            handoff.row.before_finish = lambda: self._keep(slot)

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

        head = prompt[:-1]
        namespace = self._parts.namespace_of(pick)  # the KV of these adapters' weights
        if len(head) < 2 or self._cache.covered(namespace, prompt) >= len(head):
            return
        cache = self._parts.kv.make_cache(self._parts.model)
        tokens = mx.array(head, dtype=mx.uint32)[None]
        step = self._parts.prefill_step
        with self._parts.rows([pick]):
            for start in range(0, len(head), step):
                self._parts.model(tokens[:, start : start + step], cache=cache)
                self._parts.kv.settle(cache)
                mx.eval([c.state for c in cache])
        self._cache.store(namespace, head, cache, session)

    def step(self) -> None:
        """Drop cancelled requests, then run one prefill/decode step and route its
        tokens (a media prefill step instead of the batch's own prefill chunk,
        turn about when both wait)."""
        gone = [slot for slot in self.batch.slots if slot.row.handle.cancelled]
        if gone:
            if self._cache.enabled:
                for slot in gone:
                    self._keep(slot)
            self.batch.remove(gone)
            for slot in gone:
                self._on_done(slot.row.handle, "cancelled")
        prefill = True
        if self.media and (self._media_turn or not self.batch.prefill_waiting):
            self._step_media()
            prefill = False
        self._media_turn = prefill
        if not len(self.batch):
            return
        began, start = time.monotonic(), time.perf_counter()
        self._route_s, self._routed = 0.0, 0
        for slot in self.batch.step(self._route, prefill=prefill):
            if slot.row.handle.started_at is None:
                slot.row.handle.started_at = began
        total = time.perf_counter() - start
        self.times.add(self._routed, total - self._route_s, self._route_s)

    def _step_media(self) -> None:
        """Advance the first media prefill by one step; once its prompt is in,
        it joins the batch. A cancelled or failed one ends here, alone."""
        work = self.media[0]
        if work.handle.cancelled:
            self.media.popleft()
            self._on_done(work.handle, "cancelled")
            return
        if work.handle.started_at is None:
            work.handle.started_at = time.monotonic()
        try:
            done = work.step()
        except Exception:  # mlx-vlm refused these inputs: the request fails, not the batch
            log.exception("media prefill failed")
            self.media.popleft()
            work.handle.emit(Failed("generation failed"))
            self._on_done(work.handle, "failed")
            return
        if done:
            self.media.popleft()
            self.adopt(work.handoff())

    def _route(self, tokens: list[Token]) -> None:
        """Hand each token to its row; remove the rows that ended."""
        start = time.perf_counter()
        finished: list[Slot] = []
        for t in tokens:
            if t.slot.row.done:
                continue  # the rest of a verify step's run, after its row ended
            row = t.slot.row
            ended = row.push(t.id, t.logprobs)
            if not ended and t.count >= t.slot.budget:
                row.finish_length()
                ended = True
            if ended:
                finished.append(t.slot)
        if finished:
            self.batch.remove(finished)
            for slot in finished:
                self._on_done(slot.row.handle, "completed")
        self._routed += len(tokens)
        self._route_s += time.perf_counter() - start

    def _keep(self, slot: Slot) -> None:
        """Keep ``slot`` 's KV cache (prompt plus generated tokens) in the
        prompt cache, under its request's session and its adapters' namespace."""
        media = slot.row.request.media
        if media is not None and not media.digest:
            return  # token ids alone do not say which image they stood for
        flush_wakeups()  # the rows served so far need not wait for the keep
        held = self.batch.extract(slot)
        if held is not None:
            cache, tokens = held
            digest = media.digest if media is not None else None
            self._parts.keep(tokens, cache, slot.row.request.session, slot.row.pick, digest)

    def fail_all(self, message: str) -> int:
        """Fail every request in the batch with ``message`` (each ends through
        ``on_done``); returns how many."""
        slots = self.batch.clear()  # no MLX work: the batch may be what broke
        handles = [slot.row.handle for slot in slots] + [m.handle for m in self.media]
        self.media.clear()
        for handle in handles:
            handle.emit(Failed(message))
            self._on_done(handle, "failed")
        return len(handles)

    def close(self) -> None:
        """Cancel what is left and restore the wired-memory limit."""
        import mlx.core as mx

        for slot in self.batch.clear():
            slot.row.handle.cancel()
        while self.media:
            self.media.popleft().handle.cancel()
        if self._old_wired_limit is not None:
            from mlx_lm.generate import generation_stream

            mx.synchronize(generation_stream)
            mx.set_wired_limit(self._old_wired_limit)
            self._old_wired_limit = None

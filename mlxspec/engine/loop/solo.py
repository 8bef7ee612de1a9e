"""One request decoding alone on mlx-lm's ``generate_step``, a token per engine step.

``generate_step`` is mlx-lm's fastest single-sequence loop (one row of
mlx-lm's ``BatchGenerator`` decoded at about 0.7x of it; mlxspec's own batched
step, :mod:`.decode`, runs one unpadded row without a mask, near it:
``benchmarks/README.md``). A
:class:`SoloRun` drives ``generate_step`` one token at a time, so the engine
loop sees new jobs between tokens. The serial lane runs it to the end
(:func:`run_alone`); the batched lane runs a lone request this way and, when a
second request arrives, moves it into the batch (:meth:`SoloRun.handoff`,
:meth:`~.batching.BatchLane.adopt`) with its KV cache, logits processors
(the grammar's matcher state included) and :class:`~.rows.Row`.

Prompts longer than one prefill chunk are prefilled here a chunk per step
(cancellation and arrivals are seen between chunks); ``generate_step`` gets
the last chunk.

What the KV cache holds: ``generate_step`` runs one token ahead. When it
yields generated token ``k`` it has already fed ``k`` to the model and sampled
token ``k + 1`` (evaluated asynchronously). So between steps the cache holds
the prompt plus tokens ``0..k``, and token ``k + 1`` is sampled but not fed:
:class:`_Lookahead` keeps it, and a handoff reports it and feeds it to the batch,
so no forward pass is repeated or lost.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mlxspec.engine.loop.lanes import Handoff, LaneParts, StepTimes, start_request
from mlxspec.engine.sampling.sampler import needs_global_seed, penalty_window, with_history

if TYPE_CHECKING:
    from mlxspec.engine.loop.handles import RequestHandle


class _Lookahead:
    """A sampler that remembers its last draw (the token ``generate_step``
    sampled ahead of the one it yielded) and that draw's log-probabilities."""

    def __init__(self, sampler: Any) -> None:
        self.sampler = sampler
        self.last: tuple[Any, Any] | None = None

    def __call__(self, logprobs: Any) -> Any:
        token = self.sampler(logprobs)
        self.last = (token, logprobs)
        return token


class SoloRun:
    """A request decoding alone, stepped by the engine loop.

    Args:
        handle (RequestHandle): the request.
        parts (LaneParts): model, tokenizer, caches of the engine.
        budget (int): tokens it may generate (>= 1).
        lane (str): reported in ``Finished`` (``"serial"`` or ``"batched"``).
        times (StepTimes | None): where its decode steps are timed. Default:
            ``None`` (its own).
    """

    def __init__(
        self,
        handle: RequestHandle,
        parts: LaneParts,
        budget: int,
        lane: str,
        times: StepTimes | None = None,
    ) -> None:
        self.handle, self._parts, self._budget = handle, parts, budget
        #: Where this run's decode steps are timed (the engine's, for ``GET /stats``).
        self.times = StepTimes() if times is None else times
        #: ``"completed"`` or ``"cancelled"`` once the request ended.
        self.outcome = "completed"
        start = start_request(handle, parts, budget, lane)
        self.row, self._grammar, self._processors = start.row, start.grammar, start.processors
        self._cache = start.cache if start.cache is not None else parts.kv.make_cache(parts.model)
        self._fed = len(start.held)  # prompt tokens the KV cache holds before generation starts
        #: The prompt plus every token handed to the row.
        self._tokens = list(handle.request.prompt)
        self.row.before_finish = self._keep
        self._sampler = _Lookahead(start.sampler)
        self._steps: Any = None

    def step(self) -> bool:
        """Prefill one chunk or decode one token; True once the request ended
        (``Finished`` emitted, or cancelled: see :attr:`outcome`).

        Raises:
            Exception: whatever the model or a processor raised; the run is over.
        """
        if self.handle.cancelled:
            return self._cancel()
        try:
            with self._parts.rows([self.row.pick]):  # its adapters, in every model call here
                return self._step()
        except BaseException:
            self._close()
            raise

    def _step(self) -> bool:
        if self._steps is None:
            if len(self.handle.request.prompt) - self._fed > self._parts.prefill_step:
                self._prefill_chunk()
                return False
            self._steps = self._start()
        start = time.perf_counter()
        token, logprobs = next(self._steps)
        self._parts.kv.settle(self._cache)  # generate_step reads the same list
        stepped = time.perf_counter()
        ended = self._push(token, logprobs)
        self.times.add(1, stepped - start, time.perf_counter() - stepped)
        if ended:
            self._close()
        return ended

    def handoff(self) -> Handoff | None:
        """Stop here and describe the request for the batch to continue it.

        After a decode step, the token sampled ahead is handed to the row first
        (it was sampled with this run's processors and sampler); it may end the
        request, and then there is nothing to hand over.

        Returns:
            Handoff | None: the batch's row options, or ``None`` when the request
            ended (see :attr:`outcome`).
        """
        if self.handle.cancelled:
            self._cancel()
            return None
        prompt = list(self.handle.request.prompt)
        if self._steps is None:  # not decoding yet: the cache holds prompt[:fed]
            feed, held = prompt[self._fed :], prompt[: self._fed]
        else:
            assert self._sampler.last is not None
            token, logprobs = self._sampler.last
            self._close()
            if self._push(int(token.item()), logprobs.squeeze(0)):
                return None
            feed, held = self._tokens[-1:], self._tokens[:-1]
        self.row.before_finish = None  # the batch keeps the KV cache from now on
        return Handoff(
            row=self.row,
            feed=feed,
            held=held,
            cache=self._cache if held else None,
            max_tokens=self._budget - self.row.count,
            sampler=self._sampler.sampler,
            processors=self._processors,
            grammar=self._grammar,
        )

    def cancel(self) -> None:
        """Cancel the request (engine shutdown) and release ``generate_step``."""
        self.handle.cancel()
        self._cancel()

    def _push(self, token: int, logprobs: Any) -> bool:
        self._tokens.append(token)
        if self.row.push(token, logprobs):
            return True
        if self.row.count >= self._budget:
            self.row.finish_length()
            return True
        return False

    def _cancel(self) -> bool:
        self.outcome = "cancelled"
        self._close()
        self._keep()
        return True

    def _close(self) -> None:
        """Close ``generate_step`` here, on the engine thread: its MLX stream
        context must not be finalized by a garbage collection on another thread."""
        if self._steps is not None:
            self._steps.close()

    def _prefill_chunk(self) -> None:
        """Feed the next ``prefill_step`` prompt tokens (as ``generate_step``'s
        prefill loop does)."""
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        end = self._fed + self._parts.prefill_step
        chunk = mx.array(self.handle.request.prompt[self._fed : end], dtype=mx.uint32)
        with mx.stream(generation_stream):
            self._parts.model(chunk[None], cache=self._cache)
            self._parts.kv.settle(self._cache)  # --quantized-kv-start passed
            mx.eval([c.state for c in self._cache])
        self._fed += chunk.size
        mx.clear_cache()

    def _start(self) -> Any:
        """``generate_step`` on the rest of the prompt; its processors also see
        the tokens already in the KV cache (:func:`~.prompt_cache.with_history`)."""
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        req = self.handle.request
        processors = with_history(
            self._processors, req.prompt[: self._fed], penalty_window(req.logits)
        )
        if self._grammar is not None:  # the mask goes last: after penalties and logit_bias
            processors = [*processors, self._grammar]
        return generate_step(
            mx.array(req.prompt[self._fed :], dtype=mx.uint32),
            self._parts.model,
            max_tokens=self._budget,
            sampler=self._sampler,
            logits_processors=processors,
            prompt_cache=self._cache,
            prefill_step_size=self._parts.prefill_step,
        )

    def _keep(self) -> None:
        """Keep the KV cache (it holds a prefix of the prompt and the tokens so far)."""
        self._parts.keep(self._tokens, self._cache, self.handle.request.session, self.row.pick)


def run_alone(
    handle: RequestHandle,
    parts: LaneParts,
    budget: int,
    times: StepTimes | None = None,
    between: Callable[[], None] | None = None,
) -> str:
    """Run one request to its end on the serial lane (MLX's global random
    stream seeded first when its sampler draws from it: :func:`needs_global_seed`).

    Args:
        handle (RequestHandle): the request.
        parts (LaneParts): the engine's parts.
        budget (int): tokens it may generate (>= 1).
        times (StepTimes | None): where its decode steps are timed. Default: ``None``.
        between (Callable | None): called after each step (the scheduler drops
            requests cancelled while they wait). Default: ``None``.

    Returns:
        str: ``"completed"`` or ``"cancelled"``.
    """
    import mlx.core as mx

    seed = handle.request.sampling.seed
    if seed is not None and needs_global_seed(handle.request.sampling):
        mx.random.seed(seed)
    run = SoloRun(handle, parts, budget, lane="serial", times=times)
    while not run.step():
        if between is not None:
            between()
    return run.outcome

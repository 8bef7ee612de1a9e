"""The engine: one thread owns MLX; handlers talk to it through an asyncio bridge.

Requests queue to a single engine thread (as mlx-lm's ``ResponseGenerator``
does). With ``max_batch > 1`` they join a continuous batch
(:class:`~.batching.BatchLane`, on mlx-lm's ``BatchGenerator``) between decode
steps; with ``max_batch == 1``, and for requests with an explicit ``seed``
(whose random stream must not depend on batch-mates, as in mlx_lm.server),
they run alone on mlx-lm's ``generate_step``. Either way a :class:`~.rows.Row`
detokenizes, matches stop strings and emits :mod:`types` events back to the
request's event loop. Cancelling a handle stops it at the next decode step.
Both lanes start a request from the best prefix in :attr:`Engine.prompt_cache`
and keep its KV cache there when it ends (:mod:`.prompt_cache`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import functools
import logging
import queue
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

from .admission import Admission, AdmissionLimits
from .batching import BatchLane
from .embedding import is_embedding_model
from .fit import ModelMemory, model_memory
from .grammar import GrammarCache
from .loader import weights_fingerprint
from .prompt import encode_text, normalize_messages, render_chat
from .prompt_cache import (
    DEFAULT_PROMPT_CACHE_BYTES,
    CacheNamespace,
    PromptCache,
    cache_length,
    penalty_window,
    with_history,
)
from .rows import Row
from .sampling import (
    GenerationDefaults,
    build_logits_processors,
    build_sampler,
    read_generation_config,
)
from .ssd_cache import DEFAULT_SSD_CACHE_BYTES, SsdCache
from .types import (
    Cancelled,
    Constraint,
    ContextLengthError,
    Event,
    Failed,
    Finished,
    GenerationRequest,
    ModelInfo,
)

log = logging.getLogger("mlxspec.engine")
T = TypeVar("T")

#: Prompt tokens per prefill chunk. Cancellation is noticed between chunks, so
#: a smaller chunk frees the engine sooner when a client leaves mid-prefill.
PREFILL_STEP = 512


#: Started engines, joined at interpreter exit: an engine thread still inside
#: MLX while C++ static destructors run can abort the process (exit 134).
_LIVE_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _close_live_engines() -> None:
    for engine in list(_LIVE_ENGINES):
        engine.close()


class _PrefillCancelled(Exception):
    """Raised from the prefill progress callback to abandon a cancelled request."""


class RequestHandle:
    """A submitted request: an async iterator of events, and ``cancel()``.

    Events are pushed from the engine thread with ``loop.call_soon_threadsafe``;
    iteration ends after ``Finished``, ``Failed`` or ``Cancelled``.
    """

    def __init__(self, request: GenerationRequest, loop: asyncio.AbstractEventLoop) -> None:
        self.request = request
        self._loop = loop
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()
        #: ``time.monotonic()`` at submission, for time-to-first-token.
        self.submitted_at = time.monotonic()

    @property
    def cancelled(self) -> bool:
        """True once :meth:`cancel` was called."""
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Stop this request: the engine drops it at its next decode step and
        iteration ends with ``Cancelled``. Safe from any thread, idempotent."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self.emit(Cancelled())

    def emit(self, event: Event) -> None:
        """Deliver ``event`` to the request's loop (engine thread side)."""
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed: the client is gone
            self._cancelled.set()

    async def __aiter__(self) -> AsyncIterator[Event]:
        while True:
            event = await self._events.get()
            yield event
            if isinstance(event, (Finished, Failed, Cancelled)):
                return


class _Exclusive:
    """A callable queued to run alone on the engine thread (see ``run_exclusive``)."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.fn, self.future = fn, concurrent.futures.Future()

    def run(self) -> None:
        # A caller that stopped waiting cancelled the future: skip the work.
        if self.future.set_running_or_notify_cancel():
            try:
                self.future.set_result(self.fn())
            except Exception as exc:  # delivered to the caller, never kills the thread
                self.future.set_exception(exc)


class Engine:
    """A loaded model plus the thread that runs its generations.

    Args:
        model: an ``mlx_lm`` model (``nn.Module``).
        tokenizer: an ``mlx_lm`` ``TokenizerWrapper``.
        info (ModelInfo): id, context window, start time.
        defaults (GenerationDefaults): sampling defaults for omitted fields.
        max_batch (int): most requests decoding at once; ``1`` is serial.
            Default: ``8``.
        limits (AdmissionLimits | None): wait-queue depth and operator context
            caps (:mod:`.admission`). Default: ``None`` (64 waiting, no caps).
        prompt_cache (PromptCache | None): kept KV caches for prefix reuse.
            Default: ``None`` (a RAM-only cache of the default budget).
        grammar (bool): enforce constraints (structured output); ``False``
            (``MLXSPEC_GRAMMAR=0``) reports every one as not enforced. Default: ``True``.

    Raises:
        BudgetTooSmallError: ``limits`` leave no room for any request.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        info: ModelInfo,
        defaults: GenerationDefaults,
        max_batch: int = 8,
        limits: AdmissionLimits | None = None,
        prompt_cache: PromptCache | None = None,
        grammar: bool = True,
    ) -> None:
        self.model = model
        self.max_batch = max_batch
        self.tokenizer = tokenizer
        self.info = info
        self.defaults = defaults
        self._jobs: queue.Queue[RequestHandle | _Exclusive | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._eos = set(tokenizer.eos_token_ids)
        self._xtc_special = list(tokenizer.encode("\n")) + sorted(self._eos)
        self.grammars = GrammarCache(tokenizer, info.vocab_size, self._eos, enabled=grammar)
        #: Requests by outcome, updated on the engine thread (read for /stats and tests).
        self.counters = {"completed": 0, "cancelled": 0, "failed": 0}
        #: Requests accepted by :meth:`submit` (each ends in one of ``counters``).
        self.submitted = 0
        limits = limits or AdmissionLimits()
        memory = self.memory if limits.memory_budget is not None else None
        self.admission = Admission(limits, max_batch, info.context_window, memory)
        #: Prefix KV reuse across requests (``stats()`` feeds ``GET /stats``).
        self.prompt_cache = prompt_cache if prompt_cache is not None else PromptCache()
        #: Everything that changes KV numbers: the model and its weights (no adapters
        #: or KV quantisation yet).
        self.cache_namespace = CacheNamespace(info.id, weights=info.weights)

    @functools.cached_property
    def memory(self) -> ModelMemory:
        """The model's weight bytes and per-token KV cache bytes (:mod:`.fit`)."""
        return model_memory(self.model)

    @classmethod
    def load(
        cls,
        path: Path,
        model_id: str,
        *,
        source: str = "local",
        overrides: GenerationDefaults | None = None,
        max_batch: int = 8,
        limits: AdmissionLimits | None = None,
        prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
        ssd_cache: Path | None = None,
        ssd_cache_bytes: int = DEFAULT_SSD_CACHE_BYTES,
        grammar: bool = True,
    ) -> Engine:
        """Load an MLX model folder with ``mlx_lm.load``.

        Args:
            path (Path): folder with config.json, safetensors and tokenizer files.
            model_id (str): the id responses echo.
            source (str): where the folder came from. Default: ``"local"``.
            overrides (GenerationDefaults | None): server CLI sampling flags,
                which win over ``generation_config.json``. Default: ``None``.
            max_batch (int): concurrency cap; ``1`` is serial. Default: ``8``.
            limits (AdmissionLimits | None): admission limits. Default: ``None``.
            prompt_cache_bytes (int): prompt cache RAM budget; ``0`` disables
                it. Default: :data:`~.prompt_cache.DEFAULT_PROMPT_CACHE_BYTES`.
            ssd_cache (Path | None): directory of the SSD tier. Default: ``None``.
            ssd_cache_bytes (int): disk budget of the SSD tier.
                Default: :data:`~.ssd_cache.DEFAULT_SSD_CACHE_BYTES`.
            grammar (bool): enforce constraints. Default: ``True``.

        Returns:
            Engine: not yet started; call :meth:`start`.
        """
        from mlx_lm import load

        model, tokenizer = load(str(path))
        window = getattr(getattr(model, "args", None), "max_position_embeddings", None)
        window = window or getattr(tokenizer, "model_max_length", None) or 4096
        vocab = getattr(getattr(model, "args", None), "vocab_size", None)
        info = ModelInfo(
            id=model_id,
            context_window=int(window),
            created=int(time.time()),
            source=source,
            vocab_size=int(vocab) if vocab else None,
            embedding=is_embedding_model(Path(path), model_id),
            weights=weights_fingerprint(Path(path)),
        )
        defaults = read_generation_config(Path(path)).merged(
            **(overrides or GenerationDefaults()).__dict__
        )
        ssd = None
        if ssd_cache is not None and prompt_cache_bytes > 0:
            ssd = SsdCache(ssd_cache, ssd_cache_bytes)
        elif ssd_cache is not None:
            log.warning("the prompt cache is off (budget 0): --ssd-cache is not used")
        cache = PromptCache(prompt_cache_bytes, ssd)
        return cls(
            model,
            tokenizer,
            info,
            defaults,
            max_batch=max_batch,
            limits=limits,
            prompt_cache=cache,
            grammar=grammar,
        )

    def start(self) -> None:
        """Start the engine thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mlxspec-engine", daemon=True)
            self._thread.start()
            _LIVE_ENGINES.add(self)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the engine thread after the current request."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None
        _LIVE_ENGINES.discard(self)

    # Prompt building (runs on the caller's thread; no MLX work).
    def chat_prompt(
        self, messages: list, tools: list | None = None, template_kwargs: dict | None = None
    ) -> list[int]:
        """Template and tokenize chat messages. Raises ``PromptError``."""
        normalized = normalize_messages(messages, self.info.id)
        return render_chat(self.tokenizer, normalized, tools=tools, template_kwargs=template_kwargs)

    def text_prompt(self, prompt: str) -> list[int]:
        """Tokenize a raw completion prompt (no template)."""
        return encode_text(self.tokenizer, prompt)

    def check_fits(self, prompt_tokens: int, param: str = "messages") -> None:
        """Raise ``ContextLengthError`` unless the prompt leaves room for one token.

        Args:
            prompt_tokens (int): prompt length in tokens.
            param (str): the request field named in the error. Default: ``"messages"``.
        """
        limit = self.info.context_window
        if prompt_tokens >= limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens, but the prompt "
                f"has {prompt_tokens} tokens, leaving no room to generate.",
                param=param,
            )

    def grammar_problem(self, constraint: Constraint) -> str | None:
        """Compile ``constraint`` into the grammar cache ahead of :meth:`submit`.

        Thread-safe; a first compile can take a while, so call it off the event loop.

        Returns:
            str | None: ``None`` if the constraint will be enforced, else why not
            (the handler's degrade path puts it in the ``Warning`` header).
        """
        return self.grammars.problem(constraint)

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet ended (running or waiting)."""
        ended = self.counters["completed"] + self.counters["cancelled"] + self.counters["failed"]
        return self.submitted - ended + self.admission.held  # decisions, embeddings

    def submit(self, request: GenerationRequest, prompt_param: str = "messages") -> RequestHandle:
        """Queue ``request``; iterate the returned handle for its events.

        Must be called from a running asyncio event loop.

        Args:
            request (GenerationRequest): the job.
            prompt_param (str): the request field holding the prompt, named in
                errors. Default: ``"messages"``.

        Raises:
            ContextLengthError: the prompt does not fit the context window.
            ContextBudgetError: it leaves no room under the operator's cap.
            QueueFullError: the wait queue is full.
        """
        self.check_fits(len(request.prompt), prompt_param)
        self.admission.admit(len(request.prompt), self.in_flight, prompt_param)
        handle = RequestHandle(request, asyncio.get_running_loop())
        self.submitted += 1
        self._jobs.put(handle)
        return handle

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the engine thread between decode steps; await its result.

        For MLX work outside generation (decision scoring, embeddings): the one
        thread that owns MLX runs it, in queue order with submitted requests,
        while the batch waits. Cancelling the awaiting task before ``fn`` starts
        skips it; once started it runs to the end and its result is dropped.

        Args:
            fn (Callable[[], T]): the work; no arguments.

        Returns:
            T: what ``fn`` returned.

        Raises:
            Exception: whatever ``fn`` raised, re-raised in the caller.
        """
        job = _Exclusive(fn)
        self._jobs.put(job)
        return await asyncio.wrap_future(job.future)

    # Engine thread.
    def _run(self) -> None:
        lane = self._new_lane() if self.max_batch > 1 else None
        try:
            while self._admit(lane):
                if lane is not None and len(lane):
                    try:
                        lane.step()
                    except Exception:  # a broken batch fails its rows, not the engine
                        log.exception("batch step failed")
                        self.counters["failed"] += lane.fail_all("generation failed")
                        lane.close()
                        lane = self._new_lane()
        finally:
            if lane is not None:
                lane.close()

    def _admit(self, lane: BatchLane | None) -> bool:
        """Take queued requests (waiting only when idle); False on shutdown."""
        idle = lane is None or not len(lane)
        try:
            handle = self._jobs.get(block=idle)
        except queue.Empty:
            return True
        while handle is not None:
            if isinstance(handle, _Exclusive):
                handle.run()
            elif handle.cancelled:
                self._count("cancelled")
            elif lane is None or handle.request.sampling.seed is not None:
                self._serial(handle)
            else:
                self._join(lane, handle)
            try:
                handle = self._jobs.get_nowait()
            except queue.Empty:
                return True
        return False

    def _join(self, lane: BatchLane, handle: RequestHandle) -> None:
        """Add ``handle`` to the batch; a request the batch rejects fails alone
        (an exception here used to end the engine thread, hanging every request)."""
        try:
            lane.add(handle, self._budget(handle.request))
        except Exception:
            log.exception("batch insert failed")
            handle.emit(Failed("generation failed"))
            self._count("failed")

    def _new_lane(self) -> BatchLane:
        return BatchLane(
            self.model,
            self.tokenizer,
            self._eos,
            self._xtc_special,
            self.max_batch,
            on_done=self._count,
            prefill_step=PREFILL_STEP,
            prompt_cache=self.prompt_cache,
            namespace=self.cache_namespace,
            grammars=self.grammars,
        )

    def _count(self, outcome: str) -> None:
        self.counters[outcome] += 1

    def _budget(self, req: GenerationRequest) -> int:
        """Tokens this request may generate: its ``max_tokens`` capped by the room
        left in the context window or under the operator's cap."""
        return self.admission.room(len(req.prompt), req.max_tokens)

    def _serial(self, handle: RequestHandle) -> None:
        try:
            outcome = self._generate(handle)
        except Exception:  # never kill the engine thread
            log.exception("generation failed")
            handle.emit(Failed("generation failed"))
            outcome = "failed"
        self._count(outcome)

    def _generate(self, handle: RequestHandle) -> str:
        """Run one request alone to its end; returns ``"completed"`` or ``"cancelled"``."""
        import mlx.core as mx
        from mlx_lm.generate import generate_step
        from mlx_lm.models.cache import make_prompt_cache

        req = handle.request
        if req.sampling.seed is not None:
            mx.random.seed(req.sampling.seed)
        grammar = self.grammars.for_request(req.constraint)
        cache, cached = self.prompt_cache.fetch(self.cache_namespace, req.prompt, req.session)
        if cache is None:
            cache = make_prompt_cache(self.model)
        row = Row(handle, self.tokenizer, self._eos, lane="serial", cached=cached, grammar=grammar)
        history = req.prompt[:cached]
        processors = with_history(
            build_logits_processors(req.logits), history, penalty_window(req.logits)
        )
        if grammar is not None:  # the mask goes last: after penalties and logit_bias
            processors = [*processors, grammar]

        def progress(_done: int, _total: int) -> None:
            if handle.cancelled:
                raise _PrefillCancelled

        steps = generate_step(
            mx.array(req.prompt[cached:], dtype=mx.uint32),
            self.model,
            max_tokens=self._budget(req),
            sampler=build_sampler(req.sampling, self._xtc_special),
            logits_processors=processors,
            prompt_cache=cache,
            prefill_step_size=PREFILL_STEP,
            prompt_progress_callback=progress,
        )
        tokens = list(req.prompt)
        row.before_finish = lambda: self._keep(req, tokens, cache)
        outcome = self._drive(handle, row, steps, tokens)
        if not row.done:  # cancelled: keep what was computed
            self._keep(req, tokens, cache)
        return outcome

    @staticmethod
    def _drive(handle: RequestHandle, row: Row, steps: Any, tokens: list[int]) -> str:
        """Feed ``steps`` into ``row`` until the request ends, appending each
        generated token to ``tokens``; returns the outcome."""
        try:
            for token, logprobs in steps:
                if handle.cancelled:
                    return "cancelled"
                tokens.append(int(token))
                if row.push(token, logprobs):
                    return "completed"
        except _PrefillCancelled:
            return "cancelled"
        row.finish_length()
        return "completed"

    def _keep(self, req: GenerationRequest, tokens: list[int], cache: list[Any]) -> None:
        """Keep a serial request's KV cache: it holds a prefix of ``tokens``
        (``generate_step`` runs one token ahead only while generation goes on)."""
        held = cache_length(cache)
        if held is None or held > len(tokens):
            return
        try:
            self.prompt_cache.store(self.cache_namespace, tokens[:held], cache, req.session)
        except Exception:  # the cache is an optimisation: never fail the request
            log.exception("prompt cache store failed")

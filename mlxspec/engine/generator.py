"""The engine: one thread owns MLX; handlers talk to it through an asyncio bridge.

Requests queue to a single engine thread (as mlx-lm's ``ResponseGenerator``
does); each runs mlx-lm's ``generate_step`` with its own sampler and logits
processors, detokenizes incrementally, matches stop strings on text and emits
:mod:`types` events back to the request's event loop. Cancelling a handle
stops its generation at the next decode step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from .prompt import encode_text, normalize_messages, render_chat
from .sampling import (
    GenerationDefaults,
    build_logits_processors,
    build_sampler,
    read_generation_config,
)
from .stops import StopMatcher
from .types import (
    Cancelled,
    ContextLengthError,
    Delta,
    Event,
    Failed,
    Finished,
    GenerationRequest,
    ModelInfo,
    TokenLogprob,
    TopLogprob,
)

log = logging.getLogger("mlxspec.engine")


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


class Engine:
    """A loaded model plus the thread that runs its generations.

    Args:
        model: an ``mlx_lm`` model (``nn.Module``).
        tokenizer: an ``mlx_lm`` ``TokenizerWrapper``.
        info (ModelInfo): id, context window, start time.
        defaults (GenerationDefaults): sampling defaults for omitted fields.
    """

    def __init__(
        self, model: Any, tokenizer: Any, info: ModelInfo, defaults: GenerationDefaults
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.info = info
        self.defaults = defaults
        self._jobs: queue.Queue[RequestHandle | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._eos = set(tokenizer.eos_token_ids)
        self._xtc_special = list(tokenizer.encode("\n")) + sorted(self._eos)
        #: Requests by outcome, updated on the engine thread (read for /stats and tests).
        self.counters = {"completed": 0, "cancelled": 0, "failed": 0}

    @classmethod
    def load(
        cls,
        path: Path,
        model_id: str,
        *,
        source: str = "local",
        overrides: GenerationDefaults | None = None,
    ) -> Engine:
        """Load an MLX model folder with ``mlx_lm.load``.

        Args:
            path (Path): folder with config.json, safetensors and tokenizer files.
            model_id (str): the id responses echo.
            source (str): where the folder came from. Default: ``"local"``.
            overrides (GenerationDefaults | None): server CLI sampling flags,
                which win over ``generation_config.json``. Default: ``None``.

        Returns:
            Engine: not yet started; call :meth:`start`.
        """
        from mlx_lm import load

        model, tokenizer = load(str(path))
        window = getattr(getattr(model, "args", None), "max_position_embeddings", None)
        window = window or getattr(tokenizer, "model_max_length", None) or 4096
        info = ModelInfo(
            id=model_id, context_window=int(window), created=int(time.time()), source=source
        )
        defaults = read_generation_config(Path(path)).merged(
            **(overrides or GenerationDefaults()).__dict__
        )
        return cls(model, tokenizer, info, defaults)

    def start(self) -> None:
        """Start the engine thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mlxspec-engine", daemon=True)
            self._thread.start()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the engine thread after the current request."""
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(timeout)
            self._thread = None

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

    def check_fits(self, prompt_tokens: int) -> None:
        """Raise ``ContextLengthError`` unless the prompt leaves room for one token.

        Args:
            prompt_tokens (int): prompt length in tokens.
        """
        limit = self.info.context_window
        if prompt_tokens >= limit:
            raise ContextLengthError(
                f"This model's maximum context length is {limit} tokens, but the prompt "
                f"has {prompt_tokens} tokens, leaving no room to generate.",
                param="messages",
            )

    def submit(self, request: GenerationRequest) -> RequestHandle:
        """Queue ``request``; iterate the returned handle for its events.

        Must be called from a running asyncio event loop.

        Raises:
            ContextLengthError: the prompt does not fit the context window.
        """
        self.check_fits(len(request.prompt))
        handle = RequestHandle(request, asyncio.get_running_loop())
        self._jobs.put(handle)
        return handle

    # Engine thread.
    def _run(self) -> None:
        while (handle := self._jobs.get()) is not None:
            try:
                outcome = "cancelled" if handle.cancelled else self._generate(handle)
            except Exception:  # never kill the engine thread
                log.exception("generation failed")
                handle.emit(Failed("generation failed"))
                outcome = "failed"
            self.counters[outcome] += 1

    def _generate(self, handle: RequestHandle) -> str:
        """Run one request to its end; returns ``"completed"`` or ``"cancelled"``."""
        import mlx.core as mx
        from mlx_lm.generate import generate_step

        req = handle.request
        if req.sampling.seed is not None:
            mx.random.seed(req.sampling.seed)
        room = self.info.context_window - len(req.prompt)
        max_tokens = room if req.max_tokens is None else min(req.max_tokens, room)
        steps = generate_step(
            mx.array(req.prompt, dtype=mx.uint32),
            self.model,
            max_tokens=max_tokens,
            sampler=build_sampler(req.sampling, self._xtc_special),
            logits_processors=build_logits_processors(req.logits),
        )
        detok = self.tokenizer.detokenizer
        stops = StopMatcher(req.stop)
        finish, count = "length", 0
        for token, logprobs in steps:
            if handle.cancelled:
                return "cancelled"
            count += 1
            lps = self._logprobs(token, logprobs, req)
            if token in self._eos:
                finish = "stop"
                if lps:
                    handle.emit(Delta("", (token,), lps))
                break
            detok.add_token(token)
            text = stops.feed(detok.last_segment)
            if text or lps:
                handle.emit(Delta(text, (token,), lps))
            if stops.stopped:
                finish = "stop"
                break
        if not stops.stopped:
            detok.finalize()
            tail = stops.feed(detok.last_segment) + stops.flush()
            if tail:
                handle.emit(Delta(tail))
            if stops.stopped:
                finish = "stop"
        handle.emit(Finished(finish, len(req.prompt), count))
        return "completed"

    def _logprobs(self, token: int, logprobs: Any, req: GenerationRequest) -> tuple:
        if not (req.logprobs or req.top_logprobs > 0):
            return ()
        import mlx.core as mx

        top: tuple[TopLogprob, ...] = ()
        if req.top_logprobs > 0:
            k = req.top_logprobs
            ids = mx.argpartition(-logprobs, kth=k - 1)[:k]
            values = logprobs[ids]
            order = mx.argsort(-values)
            ids_l, vals_l = ids[order].tolist(), values[order].tolist()
            pieces = self.tokenizer.convert_ids_to_tokens(ids_l)
            top = tuple(TopLogprob(i, p, v) for i, p, v in zip(ids_l, pieces, vals_l, strict=True))
        return (TokenLogprob(token, logprobs[token].item(), top),)

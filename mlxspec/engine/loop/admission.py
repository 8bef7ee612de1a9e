"""Admission: which submitted requests the engine takes, and how far they may run.

Two rules, both from the reference ("Errors" of the chat route):

* a bounded wait queue: at most ``max_queue`` requests wait for a decode slot;
  the next one is refused (:class:`QueueFullError`, HTTP 429 ``queue_full``);
* an operator context cap (``--max-context``, ``--memory-budget`` and/or
  ``--kv-budget``, opt-in): a prompt that leaves no room to generate under the
  cap is refused (:class:`ContextBudgetError`, HTTP 400 ``context_over_budget``),
  and a prompt that fits has its ``max_tokens`` capped to the room left (a
  ceiling, not a promise). Without a cap nothing is refused or shortened beyond
  the model's own context window.

A byte budget also bounds the requests together: a request waits in line for
a decode slot until the KV cache the running requests project (prompt plus
generation budget, each) leaves room for its own (the reference's
``batch.kv_bytes`` / ``kv_budget_bytes``); :class:`~.kv_ledger.KvLedger`
holds those projections, and admission asks it how many would wait.

Runs on the submitting thread (the event loop); no MLX work.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from mlxspec.engine.loop.kv_ledger import KvLedger
from mlxspec.engine.model.fit import ModelMemory
from mlxspec.engine.types import ContextLengthError, EngineRequestError

#: The reference's wait-queue depth (chat "Errors": 64 waiting requests).
DEFAULT_MAX_QUEUE = 64


@dataclass(frozen=True)
class AdmissionLimits:
    """Operator limits, from the ``serve`` flags.

    Args:
        max_queue (int): most requests waiting for a decode slot. Default: ``64``.
        max_context (int | None): cap on prompt + completion tokens per request
            (``--max-context``); ``None`` for none. Default: ``None``.
        memory_budget (int | None): bytes the model may use, weights included
            (``--memory-budget``); the KV cache room left after the weights and
            the transient reserve caps each request's context and the running
            requests' KV together. ``None`` for none. Default: ``None``.
        kv_budget (int | None): bytes of KV cache the running requests may
            project together (``--kv-budget``); also caps each request's
            context. ``None`` for none. Default: ``None``.
    """

    max_queue: int = DEFAULT_MAX_QUEUE
    max_context: int | None = None
    memory_budget: int | None = None
    kv_budget: int | None = None


class QueueFullError(Exception):
    """The wait queue is full; the request was not queued. ``message`` is safe to show."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ContextBudgetError(EngineRequestError):
    """The prompt leaves no room to generate under the operator's context cap."""


class BudgetTooSmallError(ValueError):
    """An operator limit leaves no room for any request (a start-up error)."""


class Admission:
    """Admission state of one engine: limits, the enforced context and rejections.

    Args:
        limits (AdmissionLimits): the operator's limits.
        slots (int): decode slots (the engine's ``max_batch``); requests in
            flight beyond these are waiting.
        window (int): the model's context window in tokens.
        memory (ModelMemory | None): the model's sizes; required when
            ``limits.memory_budget`` or ``limits.kv_budget`` is set. Default: ``None``.

    Raises:
        BudgetTooSmallError: a budget does not hold the weights plus two
            tokens of KV cache, or ``max_context`` is below 2 (a prompt needs a
            token and generation another).
    """

    def __init__(
        self,
        limits: AdmissionLimits,
        slots: int,
        window: int,
        memory: ModelMemory | None = None,
    ) -> None:
        self.limits = limits
        self.slots = slots
        self.window = window
        #: Requests refused so far, by reason (read by /stats and /metrics).
        self.rejected = {"queue_full": 0, "context_over_budget": 0}
        #: Admitted requests that are not generations (decisions, embeddings) and
        #: have not ended; the engine counts them in its ``in_flight``.
        self.held = 0
        rooms = _kv_rooms(limits, memory)
        caps = [*rooms] if limits.max_context is None else [limits.max_context, *rooms]
        #: The operator cap in tokens (within the window), or ``None`` without one.
        self.enforced_context = min([*caps, window]) if caps else None
        if self.enforced_context is not None and self.enforced_context < 2:
            raise BudgetTooSmallError(_too_small(limits, memory))
        #: Tokens of KV cache the running requests may project together, or
        #: ``None`` without a byte budget.
        self.kv_room = min(rooms) if rooms else None
        #: Bytes one token of KV cache takes (``0`` when unknown: no byte budget).
        self.kv_bytes_per_token = memory.kv_bytes_per_token if memory is not None else 0
        #: Every generation's KV projection, submitted to ended, under :attr:`kv_room`.
        self.kv = KvLedger(self.kv_room)
        #: Requests in line for a decode slot under :attr:`kv_room` (the engine
        #: thread fills and empties it; they count as waiting).
        self.kv_gate = self.kv.line

    @property
    def context_limit(self) -> int:
        """Most prompt + completion tokens a request may use."""
        return self.window if self.enforced_context is None else self.enforced_context

    def context_words(self) -> str:
        """The sentence that names :attr:`context_limit` in a context-length
        error: the model's maximum context length, or this server's limit when
        the operator's cap is the smaller (the model's window is not the bound
        the client hit)."""
        if self.enforced_context is None or self.enforced_context >= self.window:
            return f"This model's maximum context length is {self.window} tokens"
        return f"This server's context limit is {self.enforced_context} tokens"

    def waiting(self, in_flight: int) -> int:
        """Requests in flight that hold no decode slot yet (beyond the slots, or
        in line under the KV budget)."""
        return max(0, in_flight - self.slots, len(self.kv_gate))

    def running(self, in_flight: int) -> int:
        """Requests in flight that hold a decode slot."""
        return max(0, min(in_flight - len(self.kv_gate), self.slots))

    def check_window(self, prompt_tokens: int, param: str = "messages") -> None:
        """Raise ``ContextLengthError`` unless the prompt leaves the model's
        window room for one token.

        Args:
            prompt_tokens (int): prompt length in tokens.
            param (str): the request field named in the error. Default: ``"messages"``.
        """
        if prompt_tokens >= self.window:
            raise ContextLengthError(
                f"This model's maximum context length is {self.window} tokens, but the prompt "
                f"has {prompt_tokens} tokens, leaving no room to generate.",
                param=param,
            )

    def admit(
        self,
        prompt_tokens: int,
        in_flight: int,
        param: str = "messages",
        projected: int = 0,
        count: int = 1,
    ) -> None:
        """Accept a request with ``prompt_tokens`` or refuse it.

        Args:
            prompt_tokens (int): prompt length; already checked against the
                model's window by the engine.
            in_flight (int): requests submitted and not yet ended.
            param (str): the request field holding the prompt. Default: ``"messages"``.
            projected (int): its KV cache projection in tokens (prompt plus
                generation budget), for the KV line (:meth:`kv_waiting`).
                Default: ``0``.
            count (int): requests admitted together, all or none: the ``n``
                choices of one body, each its own engine request. Default: ``1``.

        Raises:
            ContextBudgetError: the prompt leaves no room under the operator cap.
            EngineRequestError: ``count`` exceeds what the server can ever hold
                at once (decode slots plus ``max_queue``), so no retry can
                succeed (400 naming ``n``).
            QueueFullError: there is no room for ``count`` more waiting requests.
        """
        limit = self.enforced_context
        if limit is not None and prompt_tokens >= limit:
            self.rejected["context_over_budget"] += 1
            raise ContextBudgetError(
                f"The prompt has {prompt_tokens} tokens, leaving no room to generate within "
                f"this server's context limit of {limit} tokens.",
                param=param,
            )
        if count > self.slots + self.limits.max_queue:
            raise EngineRequestError(
                f"n={count} choices cannot run on this server: it decodes at most "
                f"{self.slots} at once and queues at most {self.limits.max_queue} more "
                f"(--batch, --max-queue); ask for at most {self.slots + self.limits.max_queue}.",
                param="n",
            )
        self._check_queue(in_flight, projected, count)

    @contextmanager
    def hold(self, in_flight: int, job: str) -> Iterator[None]:
        """Admit one request that generates nothing (decisions, embeddings) for the
        duration of the ``with`` block: it takes a place in the queue exactly as
        a generation does (the reference reserves one per decision request).

        Args:
            in_flight (int): requests submitted and not yet ended (the engine's
                ``in_flight``, which includes :attr:`held`).
            job (str): what the request does, as the refusal names it
                (``"embedding"``, ``"decision"``).

        Raises:
            QueueFullError: ``max_queue`` requests are already waiting; the
                message names ``job`` (``queue is full (64 requests waiting);
                this embedding request was not queued, retry later``).
        """
        self._check_queue(in_flight, job=job)
        self.held += 1
        try:
            yield
        finally:
            self.held -= 1

    def kv_waiting(self, projected: int, count: int = 1) -> int:
        """How many requests would wait in the KV line once ``count`` more, each
        projecting ``projected`` tokens, join it (``0`` without a byte budget;
        :meth:`~.kv_ledger.KvLedger.waiting_after`)."""
        return self.kv.waiting_after(projected, count)

    def _check_queue(
        self, in_flight: int, projected: int | None = None, count: int = 1, job: str | None = None
    ) -> None:
        """Refuse when the last of ``count`` new requests would wait past the
        queue's end (a group queues as its members would, one after another,
        each projecting ``projected`` tokens of KV cache). ``job`` names a
        request that generates nothing in the refusal; ``None`` is a generation."""
        waiting = in_flight + count - self.slots
        if projected is not None:
            waiting = max(waiting, self.kv_waiting(projected, count))
        if waiting > self.limits.max_queue:  # it would wait past the end
            self.rejected["queue_full"] += 1
            if count > 1:  # the queue may have room, only not for all of them
                taken, size = (
                    min(self.waiting(in_flight), self.limits.max_queue),
                    self.limits.max_queue,
                )
                places = "place" if size == 1 else "places"
                raise QueueFullError(
                    f"the generation queue has no room for this request's {count} choices "
                    f"({taken} of its {size} {places} taken); retry later"
                )
            full = _requests(self.limits.max_queue)
            if job is not None:  # one queue for all jobs; the message says which was refused
                raise QueueFullError(
                    f"queue is full ({full} waiting); this {job} request was not queued, "
                    "retry later"
                )
            raise QueueFullError(f"generation queue is full ({full} waiting); retry later")

    def room(self, prompt_tokens: int, max_tokens: int | None) -> int:
        """Tokens a request may generate: ``max_tokens`` capped by the room left
        under :attr:`context_limit` (never below 1: :meth:`admit` checked the prompt)."""
        room = self.context_limit - prompt_tokens
        return max(1, room if max_tokens is None else min(max_tokens, room))


def _requests(n: int) -> str:
    return f"{n} request" if n == 1 else f"{n} requests"


def _kv_rooms(limits: AdmissionLimits, memory: ModelMemory | None) -> list[int]:
    """The KV cache room, in tokens, each byte budget leaves."""
    if limits.memory_budget is None and limits.kv_budget is None:
        return []
    if memory is None:
        raise ValueError("a byte budget needs the model's memory sizes")
    rooms = []
    if limits.memory_budget is not None:
        rooms.append(memory.context_for(limits.memory_budget))
    if limits.kv_budget is not None:
        rooms.append(limits.kv_budget // max(1, memory.kv_bytes_per_token))
    return rooms


def _too_small(limits: AdmissionLimits, memory: ModelMemory | None) -> str:
    if limits.max_context is not None and limits.max_context < 2:
        return f"--max-context {limits.max_context} leaves no room for a prompt and a reply"
    assert memory is not None
    if limits.kv_budget is not None and limits.kv_budget // max(1, memory.kv_bytes_per_token) < 2:
        return (
            f"--kv-budget of {limits.kv_budget} bytes holds less than two tokens of KV cache "
            f"({memory.kv_bytes_per_token} bytes each)"
        )
    return (
        f"--memory-budget of {limits.memory_budget} bytes leaves no room for the KV cache: "
        f"the weights take {memory.weights_bytes} bytes and each token of context "
        f"{memory.kv_bytes_per_token} bytes"
    )

"""The per-process store behind the Responses API's ``previous_response_id``.

A finished response is kept with the conversation that produced it, so a
later request can name it instead of resending the history (reference,
"POST /v1/responses": one hour TTL, a 32 MiB byte-capped LRU, observable at
``GET /stats`` as ``response_store``). A response still running is listed
too (:class:`Running`: how to read it as it stands and how to cancel it), so
``GET /v1/responses/{id}`` answers while it streams or runs in the
background, as OpenAI's API does. Nothing here touches the engine or HTTP;
the clock is injectable so expiry is testable without sleeping.
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

#: Reference defaults: entries live one hour; all entries together hold 32 MiB.
DEFAULT_TTL_S = 3600.0
DEFAULT_MAX_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Conversation:
    """What a response continues from, in chat terms.

    Args:
        instructions (str | None): the request's ``instructions`` (carried
            forward when a continuation omits them).
        system (tuple[str, ...]): texts of ``system``/``developer`` input items
            along the chain, merged after the instructions.
        messages (tuple[dict, ...]): the chat messages without the system
            message: earlier inputs and the assistant's outputs (reasoning
            excluded: it is not replayed).
    """

    instructions: str | None = None
    system: tuple[str, ...] = ()
    messages: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class StoredResponse:
    """One stored response: the object as sent, and its whole conversation
    (inputs plus this response's output), ready to be continued."""

    response: dict[str, Any]
    conversation: Conversation

    def size(self) -> int:
        """Bytes this entry counts against the cap: its UTF-8 JSON length."""
        parts = (self.response, self.conversation.instructions, self.conversation.system)
        text = json.dumps([*parts, self.conversation.messages], ensure_ascii=False)
        return len(text.encode("utf-8"))


@dataclass(frozen=True)
class Running:
    """A response that has not finished yet.

    Args:
        view (Callable[[], dict]): the ``Response`` object as it stands now
            (``status`` ``queued`` or ``in_progress``).
        cancel (Callable[[], None]): stop its generation.
        background (bool): created with ``background: true`` (only those may
            be cancelled through the API).
        done (Awaitable | None): completes once the response has ended and is
            stored; ``None`` when nothing waits on it.
    """

    view: Callable[[], dict[str, Any]]
    cancel: Callable[[], None]
    background: bool = False
    done: Awaitable[Any] | None = None


@dataclass
class _Entry:
    value: StoredResponse
    size: int
    expires: float


class ResponseStore:
    """A byte-capped LRU of :class:`StoredResponse` with a time-to-live.

    Reads refresh recency, not lifetime: an entry expires ``ttl_s`` after it
    was stored. An entry larger than the whole cap is not stored. Safe to use
    from several threads.

    Args:
        ttl_s (float): lifetime of an entry, seconds. Default: ``3600``.
        max_bytes (int): cap on the summed entry sizes. Default: 32 MiB.
        clock (Callable[[], float]): monotonic seconds. Default: ``time.monotonic``.
    """

    def __init__(
        self,
        ttl_s: float = DEFAULT_TTL_S,
        max_bytes: int = DEFAULT_MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.max_bytes, self.clock = ttl_s, max_bytes, clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._running: dict[str, Running] = {}

    def begin(self, response_id: str, running: Running) -> None:
        """List ``response_id`` as running until :meth:`end`."""
        with self._lock:
            self._running[response_id] = running

    def end(self, response_id: str) -> None:
        """``response_id`` has ended (stored by :meth:`put` first, or dropped)."""
        with self._lock:
            self._running.pop(response_id, None)

    def running(self, response_id: str) -> Running | None:
        """The running response ``response_id``, or ``None`` when it is not running."""
        with self._lock:
            return self._running.get(response_id)

    def put(self, response_id: str, value: StoredResponse) -> bool:
        """Store ``value`` under ``response_id``, evicting least recently used entries.

        Returns:
            bool: ``False`` when the entry alone is larger than ``max_bytes``
            (it is not stored).
        """
        size = value.size()
        if size > self.max_bytes:
            return False
        with self._lock:
            self._sweep()
            self._drop(response_id)
            while self._entries and self._bytes + size > self.max_bytes:
                self._drop(next(iter(self._entries)))
            self._entries[response_id] = _Entry(value, size, self.clock() + self.ttl_s)
            self._bytes += size
        return True

    def get(self, response_id: str) -> StoredResponse | None:
        """The live entry for ``response_id`` (now most recently used), or ``None``."""
        with self._lock:
            entry = self._entries.get(response_id)
            if entry is None:
                return None
            if entry.expires <= self.clock():
                self._drop(response_id)
                return None
            self._entries.move_to_end(response_id)
            return entry.value

    def delete(self, response_id: str) -> bool:
        """Remove ``response_id``; ``False`` if it was absent or expired."""
        with self._lock:
            self._sweep()
            return self._drop(response_id)

    def stats(self) -> dict[str, int]:
        """``{"entries", "bytes", "max_bytes", "ttl_ms"}`` for ``GET /stats``
        (reference, "GET /stats" ``response_store``); expired entries are not counted."""
        with self._lock:
            self._sweep()
            return {
                "entries": len(self._entries),
                "bytes": self._bytes,
                "max_bytes": self.max_bytes,
                "ttl_ms": int(self.ttl_s * 1000),
            }

    def __len__(self) -> int:
        return self.stats()["entries"]

    def _sweep(self) -> None:
        now = self.clock()
        for key in [k for k, e in self._entries.items() if e.expires <= now]:
            self._drop(key)

    def _drop(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self._bytes -= entry.size
        return True

"""The KV cache projection of the generation requests: one owner, from submission to end.

A request's projection is its prompt plus its generation budget, in tokens of
KV cache (:attr:`~.jobs.Generate.kv_tokens`). A byte budget (``--kv-budget``,
or the KV room ``--memory-budget`` leaves) bounds what the running requests
project together (the reference's ``batch.kv_bytes`` / ``kv_budget_bytes``):
:class:`KvGate` keeps requests in line, first come first served, until the
running ones leave room. :class:`KvLedger` holds every projection through the
request's life (submitted, in line, running, released), so admission's
prediction, the line and the running total are one object's state.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mlxspec.engine.loop.handles import RequestHandle
    from mlxspec.engine.loop.jobs import Generate


class KvGate:
    """Requests in line for a decode slot under a KV budget, first come first served.

    The head of the line starts when nothing runs, or when the running
    requests' projections plus its own stay within ``room``; the requests behind
    it wait their turn (no overtaking, so a long request is not starved by short
    ones). Without a room every request starts at once.

    Args:
        room (int | None): tokens of KV cache the running requests may project
            together; ``None`` for no limit.
    """

    def __init__(self, room: int | None) -> None:
        self.room = room
        self._line: deque[tuple[Any, int]] = deque()

    def __len__(self) -> int:
        return len(self._line)

    def push(self, item: Any, tokens: int) -> None:
        """Put ``item`` (a job with ``cancelled``) at the end of the line,
        projecting ``tokens`` of KV cache."""
        self._line.append((item, tokens))

    def pop_ready(self, running: int) -> tuple[Any, int] | None:
        """The head of the line and its projection if it may start now, else ``None``.

        Args:
            running (int): tokens the running requests project together.
        """
        if not self._line:
            return None
        tokens = self._line[0][1]
        if self.room is not None and running > 0 and running + tokens > self.room:
            return None
        return self._line.popleft()

    def projections(self) -> list[int]:
        """The projections of the requests in line, head first (a snapshot)."""
        return [tokens for _, tokens in list(self._line)]

    def drop_cancelled(self) -> int:
        """Take cancelled items (``item.cancelled``) out of the line; returns how many."""
        if not self._line:  # the common case, once per engine loop turn
            return 0
        kept = deque(entry for entry in self._line if not entry[0].cancelled)
        dropped = len(self._line) - len(kept)
        self._line = kept
        return dropped


class KvLedger:
    """Every generation request's KV projection, from submission to its end.

    A request is entered when it is submitted (:meth:`submit`, on the event
    loop's thread), goes into :attr:`line` when the engine thread takes its job
    off the queue (:meth:`line_up`), into the running total when the line lets
    it start (:meth:`start_next`), and out when it ends (:meth:`release`).
    Admission reads :meth:`waiting_after` to refuse a request that would wait
    past the queue's end; ``GET /stats`` reads :attr:`running_tokens` (through
    ``Engine.running_kv_tokens``). Requests are known by their handle, never by
    their place in a queue. Thread-safe.

    Args:
        room (int | None): tokens of KV cache the running requests may project
            together; ``None`` for no limit (nothing waits for room).
    """

    def __init__(self, room: int | None) -> None:
        self.room = room
        #: Requests taken off the job queue that wait for room (engine thread).
        self.line = KvGate(room)
        self._lock = threading.Lock()
        #: Submitted, not yet taken off the job queue, in submission order.
        self._incoming: dict[RequestHandle, Generate] = {}
        self._running: dict[RequestHandle, int] = {}
        self._running_tokens = 0

    @property
    def running_tokens(self) -> int:
        """Tokens of KV cache the running requests project together."""
        return self._running_tokens

    @property
    def incoming(self) -> list[int]:
        """Projections of the requests submitted and not yet in :attr:`line`, oldest first."""
        with self._lock:
            return [job.kv_tokens for job in self._incoming.values()]

    def submit(self, job: Generate) -> None:
        """Enter a submitted request (before its job is queued)."""
        with self._lock:
            self._incoming[job.handle] = job

    def line_up(self, job: Generate) -> None:
        """Move a request the engine thread took off the queue into :attr:`line`."""
        with self._lock:
            self._incoming.pop(job.handle, None)
            self.line.push(job, job.kv_tokens)

    def drop_cancelled(self) -> int:
        """Take cancelled requests out of :attr:`line`; returns how many."""
        with self._lock:
            return self.line.drop_cancelled()

    def start_next(self) -> Generate | None:
        """The head of :attr:`line` if it fits beside the running requests
        (counted running from now on), else ``None``."""
        with self._lock:
            ready = self.line.pop_ready(self._running_tokens)
            if ready is None:
                return None
            job, tokens = ready
            self._running[job.handle] = tokens
            self._running_tokens += tokens
            return job

    def release(self, handle: RequestHandle) -> None:
        """Forget a request that ended (or never started); a no-op for one not held."""
        with self._lock:
            self._incoming.pop(handle, None)
            tokens = self._running.pop(handle, None)
            if tokens is not None:
                self._running_tokens -= tokens

    def drain(self) -> list[Generate]:
        """Empty :attr:`line` (engine shutdown); returns its requests, head first."""
        with self._lock:
            jobs = []
            while (entry := self.line.pop_ready(0)) is not None:
                jobs.append(entry[0])
            return jobs

    def waiting_after(self, projected: int, count: int = 1) -> int:
        """How many requests would wait for room once ``count`` more, each
        projecting ``projected`` tokens, are submitted (``0`` without a room).

        A prediction on the submitting thread: the requests ahead (in
        :attr:`line`, then those submitted but not yet taken off the queue) are
        packed first come first served on top of :attr:`running_tokens`, as
        :meth:`start_next` will start them; several requests arriving within one
        engine step are counted this way before the engine has seen any of them.

        Args:
            projected (int): each new request's projection in tokens.
            count (int): new requests. Default: ``1``.

        Returns:
            int: requests that would wait, the new ones included.
        """
        if self.room is None:
            return 0
        with self._lock:
            running = self._running_tokens
            ahead = [*self.line.projections(), *(j.kv_tokens for j in self._incoming.values())]
        waiting = 0
        for tokens in [*ahead, *[projected] * count]:
            if waiting == 0 and (running == 0 or running + tokens <= self.room):
                running += tokens
            else:
                waiting += 1
        return waiting

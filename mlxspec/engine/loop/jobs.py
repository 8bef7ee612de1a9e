"""What the engine's job queue carries: one :data:`Job` type, a small tagged union.

The caller's side puts jobs on the queue (``Engine.submit``, ``run_exclusive``,
``close``); the engine thread takes them in order (:mod:`.scheduler`) and
tells them apart with ``match``:

* :class:`Generate`: a generation request with its token budget, whose KV
  cache projection (prompt plus budget) the :class:`~.kv_ledger.KvLedger` holds
  from submission to its end;
* :class:`Exclusive`: MLX work outside generation (:class:`~.handles.ExclusiveJob`);
* :class:`Stop`: shut the loop down.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlxspec.engine.loop.handles import ExclusiveJob, RequestHandle


@dataclass(frozen=True)
class Generate:
    """A generation request to run.

    Args:
        handle (RequestHandle): the request and its event stream.
        budget (int): tokens it may generate (>= 1): its ``max_tokens`` capped
            by the room left in the context window or under the operator's cap
            (``Admission.room``), fixed at submission.
    """

    handle: RequestHandle
    budget: int

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV cache the request may reach: its prompt plus its budget."""
        return len(self.handle.request.prompt) + self.budget

    @property
    def cancelled(self) -> bool:
        """Whether its client cancelled it (``RequestHandle.cancelled``)."""
        return self.handle.cancelled


@dataclass(frozen=True)
class Exclusive:
    """MLX work to run on the engine thread between decode steps.

    Args:
        work (ExclusiveJob): the callable and the future its caller awaits.
    """

    work: ExclusiveJob


@dataclass(frozen=True)
class Stop:
    """End the engine loop; jobs queued after it are not run."""


#: One item of the engine's job queue.
Job = Generate | Exclusive | Stop

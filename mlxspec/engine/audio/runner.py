"""The thread that runs MLX work on a transcription-only server.

With a chat model, takes run as exclusive jobs of its :class:`~mlxspec.engine.Engine`
(``run_exclusive``), between its decode steps. ``serve <whisper checkpoint>``
has no chat engine: :class:`SoloRunner` is a thread of its own with the same
``run_exclusive`` contract and job type (:class:`~mlxspec.engine.loop.handles.ExclusiveJob`),
so a stepped take runs a window per step and stops when its caller left.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from mlxspec.engine.loop.handles import ExclusiveJob

__all__ = ["ExclusiveRunner", "SoloRunner"]

T = TypeVar("T")


class ExclusiveRunner(Protocol):
    """What runs transcription work: the one thread that owns MLX."""

    async def run_exclusive(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (plain or stepped) on that thread; await its result."""
        ...


class SoloRunner:
    """A thread running exclusive jobs in order, for a server without a chat model."""

    def __init__(self) -> None:
        self._jobs: queue.Queue[ExclusiveJob | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="mlxspec-whisper", daemon=True)
        self._thread.start()

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """As :meth:`mlxspec.engine.Engine.run_exclusive`.

        Args:
            fn (Callable[[], T]): the work; one returning a generator is stepped.

        Returns:
            T: its result (a generator's return value).
        """
        job = ExclusiveJob(fn)
        self._jobs.put(job)
        try:
            return await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.left.set()
            raise

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            done = job.start()
            while not done:
                done = job.advance()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread after the current job."""
        self._jobs.put(None)
        self._thread.join(timeout)

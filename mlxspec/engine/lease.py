"""The engine's execution lease: the engine thread held idle, between decode
steps, for as long as a caller keeps it (``POST /admin/lease``, a fine-tune or
quantize job using the accelerator).

Built on :meth:`Engine.run_exclusive`: the exclusive job tells the event loop it
runs, then blocks on an event until :meth:`EngineLease.release`, so no decode
step runs meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any


class EngineLease:
    """One hold of the engine thread.

    Args:
        engine: an object with ``run_exclusive`` (:class:`~mlxspec.engine.Engine`).
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._released = threading.Event()
        self._job: asyncio.Future[Any] | None = None

    async def acquire(self) -> None:
        """Wait until the engine thread is ours.

        Raises:
            Exception: why the engine refused the exclusive job (it is closed, ...).
            asyncio.CancelledError: the caller was cancelled while waiting (the
                lease is given back).
        """
        loop = asyncio.get_running_loop()
        held: asyncio.Future[None] = loop.create_future()

        def granted() -> None:
            if not held.done():
                held.set_result(None)

        def hold() -> None:  # on the engine thread: no decode step runs meanwhile
            loop.call_soon_threadsafe(granted)
            self._released.wait()

        self._job = job = asyncio.ensure_future(self.engine.run_exclusive(hold))
        try:
            await asyncio.wait({held, job}, return_when=asyncio.FIRST_COMPLETED)
            if job.done() and not held.done():
                job.result()  # the engine refused the lease: raise why
        except BaseException:
            self._released.set()
            job.cancel()
            raise

    async def release(self, wait_s: float = 5.0) -> None:
        """Give the engine thread back, waiting up to ``wait_s`` seconds for the
        exclusive job to end (``0``: do not wait)."""
        self._released.set()
        if wait_s > 0 and self._job is not None and not self._job.done():
            await asyncio.wait({self._job}, timeout=wait_s)

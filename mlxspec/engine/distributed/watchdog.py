"""Rank 0's bound on how long the group may keep it waiting.

A rank that dies mid-collective makes MLX's backend raise on the others (the
ring's ``connection to a peer was lost``); one that hangs (stopped, swapping,
a network that drops packets) makes them wait forever inside the collective.
The watchdog is a thread that looks at the last completed plan broadcast: while
the group is healthy rank 0 completes one at least every ``tick`` seconds (idle
turns send empty plans) plus one step's time, so when none completed for
``timeout`` seconds the group is stuck, and the watchdog reports it
(:meth:`~.serving.ShardedServing.lose`: every held request answered 503,
``/health`` 503, the process ended non-zero, since the engine thread may be
stuck inside MLX and only an exit frees it). Followers watch the same way, so a
rank 0 that hangs does not keep them forever.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from mlxspec.engine.distributed.lockstep import Broadcast

#: Seconds without a completed plan broadcast before rank 0 gives the group up
#: (``MLXSPEC_DIST_TIMEOUT``); it must exceed the longest step (a prefill chunk).
DEFAULT_TIMEOUT_S = 60.0
#: Seconds the first broadcast may take: until then the ranks finish their start-up
#: (the engine, the grammar compiler, a warm-up) at their own pace.
STARTUP_TIMEOUT_S = 300.0


class Watchdog:
    """Watches the plan broadcasts and gives the group up when they stall.

    Args:
        broadcast (Broadcast): the group's broadcast (its ``last_done``).
        on_stall (Callable[[str], None]): called once with the reason
            (:meth:`~.serving.ShardedServing.lose`: 503s, ``/health``, exit).
        timeout (float): seconds without a completed broadcast. Default:
            :data:`DEFAULT_TIMEOUT_S`.
    """

    def __init__(
        self,
        broadcast: Broadcast,
        on_stall: Callable[[str], None],
        timeout: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.broadcast, self.timeout, self._on_stall = broadcast, timeout, on_stall
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start watching (a daemon thread polling four times per ``timeout``)."""
        self._thread = threading.Thread(
            target=self._watch, name="mlxspec-dist-watchdog", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (a clean shutdown)."""
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self.timeout / 4)):
            stalled = time.monotonic() - self.broadcast.last_done
            bound = self.timeout if self.broadcast.turns else max(self.timeout, STARTUP_TIMEOUT_S)
            if stalled > bound:
                self._on_stall(f"a process of the group did not answer for {stalled:.0f} s")
                return

"""One worker process of the supervisor: :class:`Child`, with an explicit state.

A child is ``mlxspec serve MODEL --unix PATH`` (:mod:`.worker`). It is started
on demand, is ``ready`` once ``GET /health`` answers 200 on its socket, is
restarted with back-off when it dies while wanted, and is drained
(``POST /admin/drain``: its prompt cache demoted to the SSD tier) before it is
stopped. The states are those of llama.cpp's server slot, one enum read top to
bottom rather than flags spread over the code.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import os
import signal
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import httpx

from mlxspec.config import ServeConfig
from mlxspec.supervisor.worker import child_config, write_config

log = logging.getLogger("mlxspec.supervisor")

#: Seconds before restart number 1, 2, 3, ... (then the last, again); a child
#: that served this long since its start is not counted as crash-looping.
BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
STABLE_S = 60.0
#: Seconds a stopping child gets to drain, then to exit after SIGTERM.
DRAIN_TIMEOUT_S = 30.0
EXIT_TIMEOUT_S = 15.0
#: Seconds a child that failed to start answers 502 at once before the next
#: request tries to start it again (no start storm for a broken model folder).
RETRY_FAILED_S = 30.0


class ChildState(enum.Enum):
    """Where a child is in its life."""

    STOPPED = "stopped"  # not running, not wanted (never started, evicted, unloaded)
    STARTING = "starting"  # spawned, not healthy yet
    READY = "ready"  # answering on its socket
    DRAINING = "draining"  # being stopped: drained, then SIGTERM
    DEAD = "dead"  # died while wanted: a restart is scheduled
    FAILED = "failed"  # never became healthy (load error, start timeout)


class ChildUnavailable(Exception):
    """The child cannot take a request now (dead, failed, or did not start)."""


class Child:
    """One model's worker process.

    Args:
        model_id (str): the id the pool routes by.
        spec (str | None): the model as ``serve`` takes it (``None``: embedded).
        config (ServeConfig): the parent's settings (the child gets them as a worker).
        directory (Path): the parent's private 0700 directory (socket, config file).
        index (int): the child's number, naming its files.
    """

    def __init__(
        self, model_id: str, spec: str | None, config: ServeConfig, directory: Path, index: int
    ) -> None:
        self.model_id, self.spec = model_id, spec
        self.socket = str(directory / f"engine-{index}.sock")
        self._config_path = directory / f"engine-{index}.json"
        write_config(child_config(config, spec, self.socket), self._config_path)
        self.start_timeout = config.pool_start_timeout
        self.state = ChildState.STOPPED
        self.proc: asyncio.subprocess.Process | None = None
        self.restarts = 0
        self.error: str | None = None
        self.active = 0  # requests the proxy has in flight on it
        self.last_used = time.monotonic()
        self.keep_alive: float | None = None  # a body's keep_alive, seconds
        self.client: httpx.AsyncClient | None = None
        self._ready = asyncio.Event()
        self._stopped = asyncio.Event()  # set while no stop is under way
        self._stopped.set()
        self._tasks: set[asyncio.Task] = set()
        self._started_at = 0.0
        self._failed_at = 0.0

    @property
    def pid(self) -> int | None:
        """The running process's id, ``None`` when there is none."""
        running = self.proc is not None and self.proc.returncode is None
        return self.proc.pid if running and self.proc is not None else None

    @property
    def resident(self) -> bool:
        """Whether the process is up or coming up (it holds memory)."""
        return self.state in (ChildState.STARTING, ChildState.READY, ChildState.DRAINING)

    async def ready(self) -> httpx.AsyncClient:
        """Wait until the child answers, starting it when stopped or failed.

        Returns:
            httpx.AsyncClient: a client bound to its socket.

        Raises:
            ChildUnavailable: it is dead (restart pending), draining, or did not start.
        """
        if self.state is ChildState.FAILED and time.monotonic() - self._failed_at < RETRY_FAILED_S:
            raise ChildUnavailable(self.error or f"the engine for {self.model_id} failed")
        if self.state in (ChildState.STOPPED, ChildState.FAILED):
            await self._spawn()
        if self.state is ChildState.STARTING:
            await self._ready.wait()
        if self.state is not ChildState.READY or self.client is None:
            why = self.error or f"the engine for {self.model_id} is {self.state.value}"
            raise ChildUnavailable(why)
        return self.client

    async def settled(self) -> None:
        """Wait until no stop is under way (a draining child has stopped)."""
        await self._stopped.wait()

    async def _spawn(self) -> None:
        """Start the process and a task that waits for its health."""
        self.state, self.error = ChildState.STARTING, None
        self._ready.clear()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket)
        cmd = [sys.executable, "-m", "mlxspec.supervisor.worker", str(self._config_path)]
        self.proc = await asyncio.create_subprocess_exec(*cmd, stdin=asyncio.subprocess.DEVNULL)
        self._started_at = time.monotonic()
        log.info("engine child for %s started (pid %d)", self.model_id, self.proc.pid)
        self._track(self._watch(self.proc))

    def _track(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        """Wait for health, then for the exit; restart a child that dies while wanted."""
        waiter = asyncio.ensure_future(proc.wait())
        try:
            await asyncio.wait_for(self._until_healthy(waiter), self.start_timeout)
        except TimeoutError:
            self.error = (
                f"the engine for {self.model_id} did not start within {self.start_timeout:g} s"
            )
            self.state = ChildState.FAILED
            proc.kill()
        if self.state is ChildState.STARTING:  # it exited before answering
            code = proc.returncode
            self.error = f"the engine for {self.model_id} failed to start (exit status {code})"
            self.state = ChildState.FAILED
        self._ready.set()
        code = await waiter
        await self._close_client()
        if self.state is ChildState.READY:  # died while serving: crash, kill -9, OOM
            self.state = ChildState.DEAD
            self.error = f"the engine for {self.model_id} exited (status {code}); restarting"
            log.error("engine child for %s (pid %d) exited with %s", self.model_id, proc.pid, code)
            await asyncio.sleep(self._backoff())
            if self.state is ChildState.DEAD:
                self.restarts += 1
                await self._spawn()
        elif self.state is ChildState.FAILED:
            self._failed_at = time.monotonic()
            log.error("%s", self.error)

    async def _until_healthy(self, exited: asyncio.Future) -> None:
        transport = httpx.AsyncHTTPTransport(uds=self.socket)
        client = httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=None)
        probe = httpx.Timeout(2.0)
        while not exited.done():
            try:
                healthy = (await client.get("/health", timeout=probe)).status_code == 200
                if healthy and self.state is ChildState.STARTING:
                    self.client, self.state = client, ChildState.READY
                    self._ready.set()
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
        await client.aclose()

    def _backoff(self) -> float:
        if time.monotonic() - self._started_at > STABLE_S:
            return BACKOFF_S[0]
        return BACKOFF_S[min(self.restarts, len(BACKOFF_S) - 1)]

    async def _close_client(self) -> None:
        if self.client is not None:
            client, self.client = self.client, None
            await client.aclose()

    async def stop(self, drain: bool = True) -> None:
        """Stop the child: drain it (prompt cache to the SSD tier), SIGTERM, and
        SIGKILL if it has not exited within :data:`EXIT_TIMEOUT_S`."""
        proc, was = self.proc, self.state
        self.state = ChildState.DRAINING
        self._stopped.clear()
        if drain and was is ChildState.READY and self.client is not None:
            with contextlib.suppress(httpx.HTTPError):
                answer = await self.client.post("/admin/drain", timeout=DRAIN_TIMEOUT_S)
                log.info("engine child for %s drained: %s", self.model_id, answer.text.strip())
        if proc is not None and proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), EXIT_TIMEOUT_S)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        await self._close_client()
        self.state = ChildState.STOPPED
        self._ready.set()
        self._stopped.set()
        log.info("engine child for %s stopped", self.model_id)

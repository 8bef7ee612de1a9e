"""The model pool: which children run (reference, ``--model-pool``).

Every served model, the default first, has one :class:`~.child.Child`. A child
starts when a request needs it; ``--pool-max-resident N`` stops the least
recently used idle one to make room (Ollama's loaded-model limit, llama-server's
router LRU); ``--pool-idle-unload SECONDS`` stops one idle that long, and a
body's ``keep_alive`` sets that time for its model (Ollama's: seconds, or
``"5m"``-style; ``0`` stops it after the request, a negative value never);
``--pool-pin MODEL`` is never stopped. A stopped child is drained first, so its
prompt cache stays on the SSD tier. A plain ``--isolate`` server is a pool of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from pathlib import Path

import httpx

from mlxspec.config import ServeConfig
from mlxspec.supervisor.child import Child, ChildState
from mlxspec.supervisor.routing import model_id, route

log = logging.getLogger("mlxspec.supervisor")

#: Seconds between idle sweeps.
SWEEP_S = 0.5
_DURATION = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*")
_UNITS = {None: 1.0, "ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: object) -> float | None:
    """A body's ``keep_alive`` in seconds (Ollama's: a number of seconds or a
    duration such as ``"5m"``); ``None`` when absent or unreadable (ignored)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str) and (match := _DURATION.fullmatch(value)):
        return float(match[1]) * _UNITS[match[2]]
    return None


class Pool:
    """The children of an ``--isolate`` parent and its resident set.

    Args:
        config (ServeConfig): ``model`` (the default), ``model_pool``,
            ``pool_max_resident``, ``pool_idle_unload``, ``pool_pin``.
        directory (Path): the private 0700 directory of the children's sockets.
    """

    def __init__(self, config: ServeConfig, directory: Path) -> None:
        self.config, self.directory = config, directory
        self.children: dict[str, Child] = {}
        self.aliases: dict[str, str] = {}
        for index, spec in enumerate((config.model, *config.model_pool)):
            mid = model_id(spec)
            if mid not in self.children:
                self.children[mid] = Child(mid, spec, config, directory, index)
            if spec is not None and spec != mid:
                self.aliases[spec] = mid
        self.default = model_id(config.model)
        self.pins = {self.aliases.get(p, p) for p in config.pool_pin}
        self.max_resident = config.pool_max_resident
        self.idle_unload = config.pool_idle_unload
        self._room = asyncio.Lock()
        self._sweeper: asyncio.Task | None = None

    @property
    def ids(self) -> list[str]:
        """The servable model ids, the default first."""
        return list(self.children)

    def resident(self) -> list[str]:
        """Ids of the children running or starting."""
        return [mid for mid, child in self.children.items() if child.resident]

    def make_default(self, spec: str) -> str:
        """Make ``spec`` (a pool id, an alias, or a model ``serve`` takes: the
        library's ``/api/hub/serve``) the default model, adding a child for it
        when the pool has none. The child starts with the next request that
        needs it; the former default keeps serving the requests that name it.

        Returns:
            str: the new default's id.
        """
        mid = self.aliases.get(spec, model_id(spec))
        if mid not in self.children:
            index = len(self.children)
            self.children[mid] = Child(mid, spec, self.config, self.directory, index)
        self.default = mid
        return mid

    def pick(self, requested: object) -> Child:
        """The child for a body's ``model`` (:func:`~.routing.route`)."""
        return self.children[route(requested, self.ids, self.default, self.aliases)]

    def any_ready(self) -> Child:
        """A child to answer a model-less read (``/health``, ``/stats``): the
        default when it runs, else any ready one, else the default (started)."""
        default = self.children[self.default]
        if default.resident:
            return default
        ready = [c for c in self.children.values() if c.state is ChildState.READY]
        return ready[0] if ready else default

    async def start(self) -> None:
        """Start the default child and the idle sweep (the parent's start-up)."""
        self._sweeper = asyncio.ensure_future(self._sweep())
        default = self.children[self.default]
        asyncio.ensure_future(self._start_quietly(default))

    async def _start_quietly(self, child: Child) -> None:
        with contextlib.suppress(Exception):
            await child.ready()

    async def acquire(self, child: Child) -> httpx.AsyncClient:
        """Count a request on ``child`` and wait until it serves, making room.

        Raises:
            ChildUnavailable: it cannot serve (dead, failed to start).
        """
        child.active += 1
        child.last_used = time.monotonic()
        try:
            # a child being stopped (evicted, keep_alive) is started again once
            # stopped: the request right after a ``keep_alive: 0`` one is served
            await child.settled()
            if not child.resident:
                await self._make_room(child)
            return await child.ready()
        except BaseException:
            child.active -= 1
            raise

    def release(self, child: Child, keep_alive: float | None = None) -> None:
        """A request on ``child`` ended; ``keep_alive`` (seconds) sets its idle
        time from now on, ``0`` stops it once idle."""
        child.active -= 1
        child.last_used = time.monotonic()
        if keep_alive is not None:
            child.keep_alive = keep_alive
        if keep_alive == 0 and child.active == 0 and child.model_id not in self.pins:
            asyncio.ensure_future(child.stop())

    async def _make_room(self, child: Child) -> None:
        """Stop least recently used idle children until ``child`` fits under
        ``--pool-max-resident`` (when none is idle, it starts over the cap)."""
        if self.max_resident is None:
            return
        async with self._room:
            while (
                len(others := [c for c in self.children.values() if c.resident and c is not child])
                >= self.max_resident
            ):
                idle = [
                    c
                    for c in others
                    if c.active == 0 and c.model_id not in self.pins and c.state is ChildState.READY
                ]
                if not idle:
                    log.warning(
                        "pool: %d models busy, starting %s over --pool-max-resident",
                        len(others),
                        child.model_id,
                    )
                    return
                victim = min(idle, key=lambda c: c.last_used)
                log.info(
                    "pool: evicting %s (least recently used) for %s",
                    victim.model_id,
                    child.model_id,
                )
                await victim.stop()

    async def _sweep(self) -> None:
        """Stop children idle past their time (``keep_alive``, else ``--pool-idle-unload``)."""
        while True:
            await asyncio.sleep(SWEEP_S)
            now = time.monotonic()
            for child in list(self.children.values()):
                ttl = child.keep_alive if child.keep_alive is not None else self.idle_unload
                idle = child.state is ChildState.READY and child.active == 0
                if (
                    idle
                    and ttl is not None
                    and ttl >= 0
                    and child.model_id not in self.pins
                    and now - child.last_used >= ttl
                ):
                    log.info(
                        "pool: unloading %s (idle %.0f s)", child.model_id, now - child.last_used
                    )
                    await child.stop()

    async def close(self) -> None:
        """Stop every child (the parent's shutdown)."""
        if self._sweeper is not None:
            self._sweeper.cancel()
        await asyncio.gather(
            *(c.stop() for c in self.children.values() if c.proc is not None),
            return_exceptions=True,
        )

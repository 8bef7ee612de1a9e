"""The Whisper worker: a child process that runs every take beside the chat engine.

One Whisper encoder pass over a 30 s window holds a CPU for seconds (tiny.en:
3.5 to 8 s on a 2-core Xeon, the encoder alone 4 to 7 s), and a chat token
takes tens of milliseconds: no slicing of a take between chat decode steps
keeps chat streams flowing, and a thread beside the engine's would share its
GIL and its CPU priority. So the service runs in a process of its own at the
lowest CPU priority (``nice 19``), with its own MLX: the chat engine's decode
steps always win the CPU, and Whisper uses whatever the chat leaves.

The child holds an ordinary :class:`~.service.WhisperService` on a
:class:`~.runner.SoloRunner` and its :class:`~.sessions.Sessions`, so idle
unload, dictation sessions, the counters, the per-take limits and the window-
by-window stepping (a cancelled call stops its take at the next window) are
theirs, unchanged. The parent (:mod:`.remote`) talks to it over one pipe:

* parent -> child: ``(checkpoint, cache_root, settings)`` once, then
  ``("call", id, method, args)``, ``("cancel", id)``.
* child -> parent: ``("emit", id, WindowDone)``, ``("done", id, value, state)``,
  ``("fail", id, error, state)``, ``("state", state)`` when the state changed
  by itself (an idle unload, a session that expired).

``state`` is :func:`state_of`'s snapshot; ``error`` is :func:`error_tuple`'s
picklable form. The child ends when the pipe closes (the parent exited).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from mlxspec.engine.audio.checkpoint import WhisperCheckpoint, WhisperModelError
from mlxspec.engine.audio.runner import SoloRunner
from mlxspec.engine.audio.service import WhisperService
from mlxspec.engine.audio.sessions import SessionError, Sessions
from mlxspec.engine.types import JobAbandoned

__all__ = ["WorkerSettings", "error_tuple", "run_worker", "state_of"]

log = logging.getLogger("mlxspec.engine.audio")

#: Seconds between the child's checks for state that changed by itself.
_STATE_EVERY_S = 0.5


@dataclass(frozen=True)
class WorkerSettings:
    """What the child's service and sessions are built with (see their docstrings)."""

    idle_unload_s: float
    resident: bool
    fp16: bool | None
    max_audio_s: float | None
    session_idle_s: float | None
    nice: int = 19


def state_of(service: WhisperService, sessions: Sessions) -> dict[str, Any]:
    """The snapshot the parent answers ``/stats`` from: the service's block,
    the sessions' block, the open session ids and whether the model is multilingual."""
    return {
        "block": service.block(),
        "sessions": sessions.block(),
        "open": tuple(sessions.open_ids),
        "multilingual": service.multilingual,
    }


def error_tuple(exc: BaseException) -> tuple[str, ...]:
    """An exception in a picklable form the parent rebuilds (``remote.rebuild``):
    ``("session", kind, message)``, ``("model", message)``, ``("abandoned",)``,
    or ``("internal", type name)`` (never an internal message)."""
    if isinstance(exc, SessionError):
        return ("session", exc.kind, exc.message)
    if isinstance(exc, WhisperModelError):
        return ("model", str(exc))
    if isinstance(exc, (JobAbandoned, asyncio.CancelledError)):
        return ("abandoned",)
    return ("internal", type(exc).__name__)


def run_worker(
    conn: Connection, checkpoint: WhisperCheckpoint, cache_root: Path, settings: WorkerSettings
) -> None:
    """The child's entry point: lowest CPU priority, then serve calls until the pipe closes.

    Args:
        conn (Connection): the child's end of the pipe.
        checkpoint (WhisperCheckpoint): what to load.
        cache_root (Path): where conversions are cached.
        settings (WorkerSettings): the service's and sessions' settings.
    """
    try:
        os.nice(settings.nice)
    except OSError:  # not permitted here: still correct, only less polite
        log.warning("the Whisper worker could not lower its CPU priority")
    asyncio.run(_serve(conn, checkpoint, cache_root, settings))


async def _serve(
    conn: Connection, checkpoint: WhisperCheckpoint, cache_root: Path, settings: WorkerSettings
) -> None:
    loop = asyncio.get_running_loop()
    runner = SoloRunner()
    service = WhisperService(
        checkpoint, runner, cache_root, idle_unload_s=settings.idle_unload_s,
        resident=settings.resident, fp16=settings.fp16,
    )  # fmt: skip
    sessions = Sessions(service, settings.max_audio_s, idle_s=settings.session_idle_s)
    calls: dict[int, asyncio.Task[None]] = {}
    cancelled_early: set[int] = set()  # a cancel that overtook its call
    closed = asyncio.Event()
    last_state: list[dict[str, Any]] = [{}]

    def send(message: tuple[Any, ...]) -> None:
        try:
            conn.send(message)
        except (OSError, ValueError):  # the parent is gone
            closed.set()

    def state() -> dict[str, Any]:
        last_state[0] = state_of(service, sessions)
        return last_state[0]

    async def call(cid: int, method: str, args: tuple[Any, ...]) -> None:
        try:
            value = await _dispatch(service, sessions, method, args, cid, send)
        except BaseException as exc:  # noqa: BLE001 - every outcome goes back to the caller
            if not isinstance(exc, (Exception, asyncio.CancelledError)):
                raise
            if not isinstance(exc, (SessionError, WhisperModelError, JobAbandoned,
                                    asyncio.CancelledError)):  # fmt: skip
                log.exception("Whisper worker call %s failed", method)
            send(("fail", cid, error_tuple(exc), state()))
        else:
            send(("done", cid, value, state()))
        finally:
            calls.pop(cid, None)

    def receive(message: tuple[Any, ...]) -> None:
        match message:
            case ("call", cid, method, args):
                if cid in cancelled_early:
                    cancelled_early.discard(cid)
                    send(("fail", cid, ("abandoned",), state()))
                else:
                    calls[cid] = loop.create_task(call(cid, method, args))
            case ("cancel", cid):
                task = calls.get(cid)
                if task is not None:
                    task.cancel()
                else:
                    cancelled_early.add(cid)

    def pump() -> None:
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                loop.call_soon_threadsafe(closed.set)
                return
            loop.call_soon_threadsafe(receive, message)

    threading.Thread(target=pump, name="mlxspec-whisper-pipe", daemon=True).start()
    while not closed.is_set():
        try:
            await asyncio.wait_for(closed.wait(), _STATE_EVERY_S)
        except TimeoutError:
            if state_of(service, sessions) != last_state[0]:  # an idle unload, an expiry
                send(("state", state()))
    runner.close(timeout=1.0)


async def _dispatch(
    service: WhisperService, sessions: Sessions, method: str, args: tuple[Any, ...],
    cid: int, send: Any,
) -> Any:  # fmt: skip
    """Run one parent call on the child's service or sessions."""
    if method == "transcribe":
        audio, options, stream = args
        emit = (lambda done: send(("emit", cid, done))) if stream else None
        return await service.transcribe(audio, options, emit)
    if method == "unload":
        return await service.unload()
    if method == "open":
        return await sessions.open(args[0])
    if method == "feed":
        return await sessions.feed(args[0], args[1])
    if method == "finish":
        return await sessions.finish(args[0])
    if method == "discard":
        return sessions.discard(args[0])
    raise ValueError(f"unknown Whisper worker call {method!r}")

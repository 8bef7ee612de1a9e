"""The parent's side of the Whisper worker process (:mod:`.worker`).

:class:`WhisperProcess` is the :class:`~.interface.TranscriberProtocol` a server
with a chat model serves: each take, load and unload is a call to the child,
whose answers come back on a reader thread and resolve the caller's future on
its event loop. :class:`RemoteSessions` is the dictation sessions' surface over
the same pipe. The child starts with the first call (``spawn``: a fresh
interpreter, its own MLX) and is started again by the next call if it died; a
call in flight when it died fails with :class:`~.checkpoint.WhisperModelError`
(a 503). A caller cancelled (its client left) sends ``cancel``: the child stops
the take at its next window.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np

from mlxspec.engine.audio.checkpoint import WhisperCheckpoint, WhisperModelError
from mlxspec.engine.audio.service import DEFAULT_IDLE_UNLOAD_S, vocabulary_usage
from mlxspec.engine.audio.sessions import (
    DEFAULT_SESSION_IDLE_S,
    ChunkReceipt,
    SessionError,
)
from mlxspec.engine.audio.types import Emit, TakeResult, TranscribeOptions, VocabularyUsage
from mlxspec.engine.audio.worker import WorkerSettings
from mlxspec.engine.types import JobAbandoned

__all__ = ["RemoteSessions", "WhisperProcess", "rebuild"]

log = logging.getLogger("mlxspec.engine.audio")

#: Session ``meta`` kept for sessions that ended (a later call answers 409/404 from the child).
_REMEMBERED = 4096


def rebuild(error: tuple[str, ...]) -> Exception:
    """The exception a child's :func:`~.worker.error_tuple` stands for."""
    match error:
        case ("session", kind, message):
            return SessionError(kind, message)
        case ("model", message):
            return WhisperModelError(message)
        case ("abandoned",):
            return JobAbandoned()
    return RuntimeError(f"the Whisper worker failed ({error[-1]})")


class WhisperProcess:
    """Whisper in a child process at the lowest CPU priority, beside the chat engine.

    Args:
        checkpoint (WhisperCheckpoint): what the child loads.
        cache_root (Path): where conversions are cached.
        idle_unload_s (float): the child releases the weights this long after
            the last take. Default: :data:`~.service.DEFAULT_IDLE_UNLOAD_S`.
        resident (bool): never release them. Default: ``False``.
        fp16 (bool | None): float16 weights (``None``: the child's device decides).
        nice (int): the child's CPU niceness (19: lowest). Default: ``19``.
    """

    def __init__(
        self, checkpoint: WhisperCheckpoint, cache_root: Path, *,
        idle_unload_s: float = DEFAULT_IDLE_UNLOAD_S, resident: bool = False,
        fp16: bool | None = None, nice: int = 19,
    ) -> None:  # fmt: skip
        self.checkpoint, self.cache_root = checkpoint, cache_root
        self.settings = WorkerSettings(idle_unload_s, resident, fp16, None,
                                       DEFAULT_SESSION_IDLE_S, nice)  # fmt: skip
        self.created = int(time.time())
        self._process: Any = None
        self._conn: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[asyncio.Future[Any], Emit | None]] = {}
        self._send_lock = threading.Lock()
        self._state: dict[str, Any] = {}
        #: Child processes started (1 after the first call; more after a crash).
        self.starts = 0

    @property
    def model_id(self) -> str:
        """The checkpoint's id."""
        return self.checkpoint.model_id

    @property
    def multilingual(self) -> bool:
        """Whether the checkpoint knows languages other than English."""
        if "multilingual" in self._state:
            return bool(self._state["multilingual"])
        return not self.model_id.endswith(".en")

    @property
    def state(self) -> dict[str, Any]:
        """The child's latest snapshot (:func:`~.worker.state_of`; empty before its first)."""
        return self._state

    def block(self) -> dict[str, Any]:
        """The ``transcription`` block of ``/stats`` (the child's latest counters)."""
        if "block" in self._state:
            return dict(self._state["block"])
        resident = self.settings.resident
        return {"model": self.model_id, "loaded": False, "resident": resident, "loads": 0,
                "unloads": 0, "requests": 0, "last_load_ms": 0.0,
                "idle_unload_sec": None if resident else self.settings.idle_unload_s}  # fmt: skip

    def vocabulary_usage(
        self, vocabulary: tuple[str, ...], prompt: str | None
    ) -> VocabularyUsage | None:
        """How ``vocabulary`` fits the prompt budget (the tokenizer, in this process)."""
        return vocabulary_usage(self.multilingual, vocabulary, prompt)

    def sessions(self, max_audio_s: float | None, idle_s: float | None) -> RemoteSessions:
        """The dictation sessions, kept in the child with these limits (set
        before the child starts: the app builds them once, at start-up)."""
        self.settings = replace(self.settings, max_audio_s=max_audio_s, session_idle_s=idle_s)
        return RemoteSessions(self, idle_s)

    async def transcribe(
        self, audio: np.ndarray, options: TranscribeOptions, emit: Emit | None = None
    ) -> TakeResult:
        """As :meth:`~.service.WhisperService.transcribe`, in the child.

        Raises:
            JobAbandoned: the take stopped unfinished.
            WhisperModelError: the checkpoint cannot load, or the child died.
        """
        return await self.call("transcribe", (audio, options, emit is not None), emit)

    async def unload(self) -> bool:
        """Release the weights in the child now; whether they were loaded."""
        if self._process is None:
            return False
        return bool(await self.call("unload", ()))

    async def call(self, method: str, args: tuple[Any, ...], emit: Emit | None = None) -> Any:
        """Run ``method`` of the child's service or sessions; await its value.

        Args:
            method (str): ``transcribe``, ``unload``, ``open``, ``feed``,
                ``finish`` or ``discard`` (:func:`~.worker._dispatch`).
            args (tuple): its arguments (picklable).
            emit (Emit | None): gets each ``WindowDone`` on this event loop.

        Returns:
            Any: what the child's method returned.

        Raises:
            Exception: the child's error, rebuilt (:func:`rebuild`).
        """
        loop = asyncio.get_running_loop()
        self._start(loop)
        self._loop = loop  # answers go to the loop that asks (one loop in a server)
        cid = next(self._ids)
        future: asyncio.Future[Any] = loop.create_future()
        self._pending[cid] = (future, emit)
        conn = self._conn
        try:  # pickling and writing seconds of audio stay off the event loop
            if not await asyncio.to_thread(self._send, conn, ("call", cid, method, args)):
                raise WhisperModelError("the Whisper worker exited")
            return await future
        except asyncio.CancelledError:
            loop.run_in_executor(None, self._send, conn, ("cancel", cid))
            raise
        finally:  # a late answer (or window) for a caller that left is dropped
            self._pending.pop(cid, None)

    def _send(self, conn: Any, message: tuple[Any, ...]) -> bool:
        """Write one message; False when the child is gone (its reader fails the calls)."""
        with self._send_lock:
            try:
                conn.send(message)
            except (OSError, ValueError, AttributeError):  # closed, or no pipe at all
                return False
            return True

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        # a fresh interpreter (never a fork of a process running MLX), started
        # with ``-m``: multiprocessing's spawn would re-run the parent's main script
        ours, theirs = socket.socketpair()
        argv = [sys.executable, "-m", "mlxspec.engine.audio.child", str(theirs.fileno())]
        process = subprocess.Popen(argv, pass_fds=(theirs.fileno(),))
        theirs.close()
        mine = Connection(ours.detach())
        mine.send((self.checkpoint, self.cache_root, self.settings))
        self._process, self._conn, self._loop = process, mine, loop
        self.starts += 1
        reader = threading.Thread(target=self._pump, args=(mine, process),
                                  name="mlxspec-whisper-reader", daemon=True)  # fmt: skip
        reader.start()

    def _pump(self, conn: Any, process: Any) -> None:
        """The reader thread: each message to the loop of the latest caller."""
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            try:
                self._call_soon(self._receive, message)
            except RuntimeError:  # the loop closed: the server is stopping
                return
        try:
            self._call_soon(self._lost, process)
        except RuntimeError:
            pass

    def _call_soon(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)

    def _receive(self, message: tuple[Any, ...]) -> None:
        match message:
            case ("emit", cid, done):
                entry = self._pending.get(cid)
                if entry is not None and entry[1] is not None and not entry[0].done():
                    entry[1](done)
            case ("done", cid, value, state):
                self._state = state
                self._settle(cid, lambda f: f.set_result(value))
            case ("fail", cid, error, state):
                self._state = state
                self._settle(cid, lambda f: f.set_exception(rebuild(error)))
            case ("state", state):
                self._state = state

    def _settle(self, cid: int, how: Callable[[asyncio.Future[Any]], None]) -> None:
        entry = self._pending.pop(cid, None)
        if entry is not None and not entry[0].done():
            how(entry[0])

    def _lost(self, process: Any) -> None:
        """The child's pipe closed: fail its calls; the next call starts a new one."""
        if process is not self._process:
            return
        try:
            code = process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:  # its pipe closed but it lingers: end it
            process.kill()
            code = process.wait()
        self._process = self._conn = None
        self._state = {k: v for k, v in self._state.items() if k != "open"}
        if "block" in self._state:
            self._state["block"] = {**self._state["block"], "loaded": False}
        pending, self._pending = self._pending, {}
        if pending:
            log.error("the Whisper worker exited (code %s) with %d calls", code, len(pending))
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(WhisperModelError(f"the Whisper worker exited (code {code})"))

    def close(self, timeout: float = 5.0) -> None:
        """Stop the child: its pipe closes, it ends; killed after ``timeout`` seconds."""
        process, conn = self._process, self._conn
        self._process = self._conn = None
        if conn is not None:
            conn.close()
        if process is not None:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class RemoteSessions:
    """The dictation sessions of a :class:`WhisperProcess` (kept in the child),
    with :class:`~.sessions.Sessions`' surface.

    Args:
        worker (WhisperProcess): the child's parent side.
        idle_s (float | None): the idle limit (``/stats`` before the child's first answer).
    """

    def __init__(self, worker: WhisperProcess, idle_s: float | None) -> None:
        self.worker, self.idle_s = worker, idle_s or None
        self._meta: collections.OrderedDict[str, Any] = collections.OrderedDict()

    @property
    def open_count(self) -> int:
        """Sessions open now (as of the child's latest answer)."""
        return len(self.worker.state.get("open", ()))

    def block(self) -> dict[str, Any]:
        """``/stats``' ``transcription.sessions``."""
        default = {"open": 0, "expired": 0, "idle_timeout_sec": self.idle_s}
        return dict(self.worker.state.get("sessions", default))

    async def open(self, options: TranscribeOptions, meta: Any = None) -> tuple[str, float]:
        """Open a session in the child (:meth:`~.sessions.Sessions.open`)."""
        session_id, load_ms = await self.worker.call("open", (options,))
        self._meta[session_id] = meta
        self._forget_ended()
        return session_id, load_ms

    def meta(self, session_id: str) -> Any:
        """The ``meta`` a session was opened with.

        Raises:
            SessionError: a session this server never opened (or long forgotten).
        """
        if session_id not in self._meta:
            raise SessionError("session_not_found", f"session '{session_id}' not found")
        return self._meta[session_id]

    async def feed(self, session_id: str, samples: np.ndarray) -> ChunkReceipt:
        """Append one chunk (:meth:`~.sessions.Sessions.feed`)."""
        return await self.worker.call("feed", (session_id, samples))

    async def finish(self, session_id: str) -> TakeResult:
        """Decode what is left and close (:meth:`~.sessions.Sessions.finish`)."""
        return await self.worker.call("finish", (session_id,))

    async def discard(self, session_id: str) -> None:
        """Drop a session (:meth:`~.sessions.Sessions.discard`)."""
        await self.worker.call("discard", (session_id,))

    def _forget_ended(self) -> None:
        """Keep ``meta`` of open sessions, and of the latest ended ones up to a bound."""
        if len(self._meta) <= _REMEMBERED:
            return
        still_open = set(self.worker.state.get("open", ()))
        for session_id in [s for s in self._meta if s not in still_open]:
            del self._meta[session_id]
            if len(self._meta) <= _REMEMBERED // 2:
                break

"""Dictation sessions: audio that arrives while it is recorded, decoded as it comes.

A session is a :class:`~.take.Take` fed chunk by chunk. After each chunk every
30 s window that now exists past the seek is decoded at once (on the MLX
thread, a window per step), so ``finish`` costs only the last window however
long the take. With the VAD gate nothing is decoded before speech was heard,
and a take without speech finishes as ``{"text": ""}`` without Whisper. At
most :data:`MAX_SESSIONS` are open; a session holds the weights until it ends,
and one that gets no request for ``idle_s`` seconds ends by itself (a client
that went away neither keeps its slot nor pins the weights).
"""

from __future__ import annotations

import asyncio
import collections
import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from mlxspec.engine.audio.pcm import SAMPLE_RATE
from mlxspec.engine.audio.service import WhisperService, result_of
from mlxspec.engine.audio.types import Segment, TakeResult, TranscribeOptions
from mlxspec.engine.audio.vad import SpeechSpans, detect_speech

if TYPE_CHECKING:  # mlx-whisper loads on the first take (see service.py)
    from mlxspec.engine.audio.take import Take

__all__ = [
    "DEFAULT_SESSION_IDLE_S",
    "MAX_SESSIONS",
    "ChunkReceipt",
    "SessionError",
    "Sessions",
]

#: Open sessions at once (reference: the 65th is a 429).
MAX_SESSIONS = 64
#: Seconds without a request before an open session is discarded (mlxspec's
#: choice; the reference keeps sessions until finished or deleted).
DEFAULT_SESSION_IDLE_S = 300.0
#: Ended session ids remembered to answer 409 (finished) or say "expired".
_REMEMBERED = 4096


class SessionError(Exception):
    """A session request that cannot be served.

    Args:
        kind (str): ``session_not_found``, ``session_finished``, ``too_many_sessions``
            or ``audio_too_long`` (rows of :data:`mlxspec.errors.ERROR_TABLE`).
        message (str): what to tell the client.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


@dataclass(frozen=True)
class ChunkReceipt:
    """The answer to one chunk: audio so far and every segment finalized so far."""

    samples: int
    duration: float
    speech: bool | None
    segments: tuple[Segment, ...]


@dataclass
class _Session:
    id: str
    options: TranscribeOptions
    take: Take | None = None
    audio: list[np.ndarray] = field(default_factory=list)
    samples: int = 0
    speech: bool = False
    spans: SpeechSpans | None = None
    finished: bool = False
    finishing: bool = False  # a finish is running: other calls are refused at once
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: float = field(default_factory=time.perf_counter)
    load_ms: float = 0.0
    meta: Any = None
    touched: float = field(default_factory=lambda: time.monotonic())  # the clock, looked up
    timer: asyncio.TimerHandle | None = None


class Sessions:
    """The open dictation sessions of one :class:`WhisperService`.

    Args:
        service (WhisperService): decodes the windows.
        max_audio_s (float | None): longest take. Default: ``None`` (no cap).
        max_sessions (int): open at once. Default: :data:`MAX_SESSIONS`.
        idle_s (float | None): seconds without a request before an open session
            is discarded (one decoding a chunk is never idle); ``None`` or ``0``
            keeps sessions until they end. Default: :data:`DEFAULT_SESSION_IDLE_S`.
    """

    def __init__(
        self, service: WhisperService, max_audio_s: float | None = None,
        max_sessions: int = MAX_SESSIONS, idle_s: float | None = DEFAULT_SESSION_IDLE_S,
    ) -> None:  # fmt: skip
        self.service, self.max_audio_s, self.max_sessions = service, max_audio_s, max_sessions
        self.idle_s = idle_s or None
        self._open: dict[str, _Session] = {}
        #: Ended ids, oldest first: ``"finished"`` or ``"deleted"`` (409), ``"expired"`` (404).
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()
        #: Sessions discarded for idling, since start.
        self.expired_total = 0

    @property
    def open_count(self) -> int:
        """Sessions open now."""
        return len(self._open)

    @property
    def open_ids(self) -> list[str]:
        """The ids of the sessions open now, oldest first."""
        return list(self._open)

    def block(self) -> dict[str, Any]:
        """``/stats``' ``transcription.sessions``: open now, discarded for idling
        since start, and the idle limit (seconds; ``None``: none)."""
        return {"open": len(self._open), "expired": self.expired_total,
                "idle_timeout_sec": self.idle_s}  # fmt: skip

    async def open(self, options: TranscribeOptions, meta: Any = None) -> tuple[str, float]:
        """Open a session; the weights load here if they were paged out.

        Args:
            options (TranscribeOptions): the take's decoding options.
            meta (Any): the caller's own data for the session (:meth:`meta`).

        Returns:
            tuple[str, float]: its id and the load time (ms).

        Raises:
            SessionError: ``too_many_sessions`` when :attr:`max_sessions` are open.
        """
        if len(self._open) >= self.max_sessions:
            raise SessionError(
                "too_many_sessions", f"at most {self.max_sessions} sessions may be open at once"
            )
        session = _Session(f"sess_{uuid.uuid4().hex[:24]}", options, meta=meta)
        self._open[session.id] = session
        self.service.hold()
        try:
            session.load_ms = await self.service.load()
        except BaseException:
            self._close(session.id)
            raise
        self._arm(session)
        return session.id, session.load_ms

    def meta(self, session_id: str) -> Any:
        """The ``meta`` an open session was opened with.

        Raises:
            SessionError: unknown, expired or finished session.
        """
        return self._get(session_id).meta

    def _get(self, session_id: str) -> _Session:
        session = self._open.get(session_id)
        if session is None:
            ended = self._ended.get(session_id)
            if ended == "finished":
                raise SessionError("session_finished", f"session '{session_id}' is finished")
            if ended == "deleted":
                raise SessionError("session_finished", f"session '{session_id}' was deleted")
            if ended == "expired":
                raise SessionError(
                    "session_not_found", f"session '{session_id}' expired after "
                    f"{self.idle_s:g} s without a request",
                )  # fmt: skip
            raise SessionError("session_not_found", f"session '{session_id}' not found")
        session.touched = time.monotonic()
        return session

    def _close(self, session_id: str, how: str = "finished") -> None:
        session = self._open.pop(session_id, None)
        if session is None:
            return
        if session.timer is not None:
            session.timer.cancel()
        self._ended[session_id] = how
        while len(self._ended) > _REMEMBERED:
            self._ended.popitem(last=False)
        self.service.release()

    def _arm(self, session: _Session) -> None:
        """Check ``session`` for idling when ``idle_s`` after its last request is due."""
        if self.idle_s is None or session.id not in self._open:
            return
        due = session.touched + self.idle_s - time.monotonic()
        loop = asyncio.get_running_loop()
        session.timer = loop.call_later(max(due, 0.0), self._reap, session)

    def _reap(self, session: _Session) -> None:
        """Discard ``session`` if it idled ``idle_s`` (busy ones wait for the next check)."""
        assert self.idle_s is not None
        if session.lock.locked():  # a chunk is being decoded: not idle
            session.touched = time.monotonic()
        if time.monotonic() - session.touched < self.idle_s:
            self._arm(session)
            return
        session.finished = True
        self.expired_total += 1
        self._close(session.id, "expired")

    async def feed(self, session_id: str, samples: np.ndarray) -> ChunkReceipt:
        """Append one chunk (16 kHz mono float32) and decode every window it completes.

        Raises:
            SessionError: unknown or finished session, or the take would pass
                ``max_audio_s``.
        """
        session = self._get(session_id)
        self._refuse_finishing(session)
        async with session.lock:
            if session.finished:
                raise SessionError("session_finished", f"session '{session_id}' is finished")
            total = (session.samples + len(samples)) / SAMPLE_RATE
            if self.max_audio_s is not None and total > self.max_audio_s:
                raise SessionError(
                    "audio_too_long", f"the take would be {total:.1f} s; at most "
                    f"{self.max_audio_s:g} s are accepted",
                )  # fmt: skip
            session.samples += len(samples)
            session.audio.append(samples)
            await self.service.runner.run_exclusive(lambda: self._advance(session, False))
            session.touched = time.monotonic()  # idle counts from the request's end
            take = session.take
            return ChunkReceipt(
                session.samples,
                session.samples / SAMPLE_RATE,
                session.speech if session.options.vad is not None else None,
                tuple(s for s in take.segments if s.text) if take else (),
            )

    def _advance(self, session: _Session, final: bool) -> Generator[None, None, None]:
        """MLX thread: run the VAD gate, then decode every ready window, one per step."""
        if session.options.vad is not None and not session.speech:
            whole = np.concatenate(session.audio) if session.audio else np.zeros(0, np.float32)
            session.spans = detect_speech(whole, session.options.vad)
            session.speech = session.spans.speech
            if not session.speech:
                return None
        if session.take is None:
            from mlxspec.engine.audio.take import Take

            self.service._load()
            session.take = Take(self.service.model, session.options, fp16=self.service.fp16)
        if session.audio:
            session.take.feed(np.concatenate(session.audio))
            session.audio.clear()
        while session.take.ready(final):
            session.take.step(final)
            yield
        return None

    async def finish(self, session_id: str) -> TakeResult:
        """Decode what is left and close the session.

        Returns:
            TakeResult: as the one-shot route's (``{"text": ""}`` without speech).

        Raises:
            SessionError: unknown or finished session.
        """
        session = self._get(session_id)
        self._refuse_finishing(session)
        session.finishing = True
        async with session.lock:
            if session.finished:
                raise SessionError("session_finished", f"session '{session_id}' is finished")
            self.service.requests += 1  # a finished take, as a one-shot request is
            try:
                await self.service.runner.run_exclusive(lambda: self._advance(session, True))
            finally:
                session.finished = True
                self._close(session_id)
        duration = session.samples / SAMPLE_RATE
        if session.take is None:  # the VAD heard nothing: Whisper never ran
            spans = session.spans or SpeechSpans(())
            return TakeResult(
                text="",
                language=session.options.language or "unknown",
                duration=duration,
                vad=spans.to_json(),
                load_ms=session.load_ms,
                task=session.options.task,
            )
        result = result_of(session.take, duration, session.spans, session.load_ms, session.started)
        return result

    def discard(self, session_id: str) -> None:
        """Drop a session (``DELETE``).

        Raises:
            SessionError: unknown, finishing or already finished.
        """
        session = self._get(session_id)
        self._refuse_finishing(session)
        session.finished = True
        self._close(session_id, "deleted")

    @staticmethod
    def _refuse_finishing(session: _Session) -> None:
        """Raises:
        SessionError: ``session_finished`` while a finish of ``session`` runs
            (rather than waiting for it to end and refusing then)."""
        if session.finishing:
            raise SessionError("session_finished", f"session '{session.id}' is finishing")

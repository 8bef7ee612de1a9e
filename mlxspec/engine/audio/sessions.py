"""Dictation sessions: audio that arrives while it is recorded, decoded as it comes.

A session is a :class:`~.take.Take` fed chunk by chunk. After each chunk every
30 s window that now exists past the seek is decoded at once (on the MLX
thread, a window per step), so ``finish`` costs only the last window however
long the take. With the VAD gate nothing is decoded before speech was heard,
and a take without speech finishes as ``{"text": ""}`` without Whisper. At
most :data:`MAX_SESSIONS` are open; a session holds the weights until it ends.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from mlxspec.engine.audio.pcm import SAMPLE_RATE
from mlxspec.engine.audio.service import WhisperService, result_of
from mlxspec.engine.audio.types import Segment, TakeResult, TranscribeOptions
from mlxspec.engine.audio.vad import SpeechSpans, detect_speech

if TYPE_CHECKING:  # mlx-whisper loads on the first take (see service.py)
    from mlxspec.engine.audio.take import Take

__all__ = [
    "MAX_SESSIONS",
    "ChunkReceipt",
    "SessionError",
    "Sessions",
]

#: Open sessions at once (reference: the 65th is a 429).
MAX_SESSIONS = 64


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
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    started: float = field(default_factory=time.perf_counter)
    load_ms: float = 0.0


class Sessions:
    """The open dictation sessions of one :class:`WhisperService`.

    Args:
        service (WhisperService): decodes the windows.
        max_audio_s (float | None): longest take. Default: ``None`` (no cap).
        max_sessions (int): open at once. Default: :data:`MAX_SESSIONS`.
    """

    def __init__(
        self, service: WhisperService, max_audio_s: float | None = None,
        max_sessions: int = MAX_SESSIONS,
    ) -> None:  # fmt: skip
        self.service, self.max_audio_s, self.max_sessions = service, max_audio_s, max_sessions
        self._open: dict[str, _Session] = {}
        self._finished: set[str] = set()

    @property
    def open_count(self) -> int:
        """Sessions open now."""
        return len(self._open)

    async def open(self, options: TranscribeOptions) -> tuple[str, float]:
        """Open a session; the weights load here if they were paged out.

        Returns:
            tuple[str, float]: its id and the load time (ms).

        Raises:
            SessionError: ``too_many_sessions`` when :attr:`max_sessions` are open.
        """
        if len(self._open) >= self.max_sessions:
            raise SessionError(
                "too_many_sessions", f"at most {self.max_sessions} sessions may be open at once"
            )
        session = _Session(f"sess_{uuid.uuid4().hex[:24]}", options)
        self._open[session.id] = session
        self.service.hold()
        try:
            session.load_ms = await self.service.load()
        except BaseException:
            self._close(session.id)
            raise
        return session.id, session.load_ms

    def _get(self, session_id: str) -> _Session:
        session = self._open.get(session_id)
        if session is None:
            if session_id in self._finished:
                raise SessionError("session_finished", f"session '{session_id}' is finished")
            raise SessionError("session_not_found", f"session '{session_id}' not found")
        return session

    def _close(self, session_id: str) -> None:
        if self._open.pop(session_id, None) is not None:
            self._finished.add(session_id)
            self.service.release()

    async def feed(self, session_id: str, samples: np.ndarray) -> ChunkReceipt:
        """Append one chunk (16 kHz mono float32) and decode every window it completes.

        Raises:
            SessionError: unknown or finished session, or the take would pass
                ``max_audio_s``.
        """
        session = self._get(session_id)
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
        async with session.lock:
            if session.finished:
                raise SessionError("session_finished", f"session '{session_id}' is finished")
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
            SessionError: unknown or already finished.
        """
        session = self._get(session_id)
        session.finished = True
        self._close(session_id)

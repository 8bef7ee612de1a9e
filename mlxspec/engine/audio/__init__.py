"""Speech to text on MLX: Whisper (mlx-whisper's model, log-mel, decoding and
tokenizer), CTranslate2 checkpoints converted once, audio decoding, Silero VAD,
one-shot takes and dictation sessions. No HTTP lives here; handlers import
these names through :mod:`mlxspec.engine` and type the service as
:class:`TranscriberProtocol`. Importing the package is cheap: mlx-whisper (seconds:
numba, scipy) loads with the first take.
"""

from mlxspec.engine.audio.checkpoint import (
    WhisperCheckpoint,
    WhisperModelError,
    default_checkpoint,
    resolve_whisper,
    whisper_only,
)
from mlxspec.engine.audio.interface import SessionsProtocol, TranscriberProtocol
from mlxspec.engine.audio.pcm import (
    MAX_RATE,
    MIN_RATE,
    SAMPLE_RATE,
    AudioDecodeError,
    AudioTooLongError,
    decode_audio,
    pcm_float32,
)
from mlxspec.engine.audio.remote import RemoteSessions, WhisperProcess
from mlxspec.engine.audio.runner import ExclusiveRunner, SoloRunner
from mlxspec.engine.audio.service import MIN_AUDIO_S, WhisperService
from mlxspec.engine.audio.sessions import (
    DEFAULT_SESSION_IDLE_S,
    MAX_SESSIONS,
    ChunkReceipt,
    SessionError,
    Sessions,
)
from mlxspec.engine.audio.types import (
    FALLBACK_TEMPERATURES,
    PROMPT_TOKEN_BUDGET,
    Segment,
    TakeProgress,
    TakeResult,
    TranscribeOptions,
    VadOptions,
    VocabularyUsage,
    WindowDone,
    fit_prompt,
)
from mlxspec.engine.types import JobAbandoned

__all__ = [
    "DEFAULT_SESSION_IDLE_S",
    "FALLBACK_TEMPERATURES",
    "MAX_RATE",
    "MAX_SESSIONS",
    "MIN_RATE",
    "MIN_AUDIO_S",
    "PROMPT_TOKEN_BUDGET",
    "SAMPLE_RATE",
    "AudioDecodeError",
    "AudioTooLongError",
    "ChunkReceipt",
    "ExclusiveRunner",
    "JobAbandoned",
    "RemoteSessions",
    "Segment",
    "SessionError",
    "Sessions",
    "SessionsProtocol",
    "SoloRunner",
    "TakeProgress",
    "TakeResult",
    "TranscribeOptions",
    "TranscriberProtocol",
    "VadOptions",
    "VocabularyUsage",
    "WhisperCheckpoint",
    "WhisperModelError",
    "WhisperProcess",
    "WhisperService",
    "WindowDone",
    "decode_audio",
    "default_checkpoint",
    "fit_prompt",
    "pcm_float32",
    "resolve_whisper",
    "whisper_only",
]

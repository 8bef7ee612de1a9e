"""Voice activity detection: Silero VAD (v6) from the ``silero-vad`` wheel.

The wheel's 16 kHz TorchScript model runs on torch's CPU build (already a
dependency of mlxspec through xgrammar), in 512-sample frames (32 ms), with
the wheel's own ``get_speech_timestamps`` for the hysteresis and minimum
durations. It takes about 10 ms per second of audio on one core, against the
hundreds of milliseconds Whisper's 30 s window costs, so it gates a take
before any Whisper work: no speech means no decoding at all. The reference
loads the same network's weights from the hub (``ggml-org/whisper-vad``); the
wheel carries them instead.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from mlxspec.engine.audio.pcm import SAMPLE_RATE
from mlxspec.engine.audio.types import VadOptions

__all__ = ["SpeechSpans", "TRIM_PAD_S", "detect_speech"]

#: Seconds kept around the speech span when ``vad_trim`` crops (reference: +- 0.5 s).
TRIM_PAD_S = 0.5

_MODEL: Any = None
_LOCK = threading.Lock()


@dataclass(frozen=True)
class SpeechSpans:
    """Where the VAD heard speech.

    Attributes:
        segments (tuple[tuple[float, float], ...]): ``(start, end)`` seconds.
    """

    segments: tuple[tuple[float, float], ...]

    @property
    def speech(self) -> bool:
        """Whether any speech was found."""
        return bool(self.segments)

    def crop(self, duration: float) -> tuple[float, float]:
        """The trimmed span: first start - 0.5 s to last end + 0.5 s, in the clip."""
        start = max(0.0, self.segments[0][0] - TRIM_PAD_S)
        return start, min(duration, self.segments[-1][1] + TRIM_PAD_S)

    def to_json(self) -> dict[str, Any]:
        """The ``mlxspec.vad`` block."""
        return {"speech": self.speech, "segments": [[s, e] for s, e in self.segments]}


def _model() -> Any:
    global _MODEL
    with _LOCK:
        if _MODEL is None:
            from silero_vad import load_silero_vad

            _MODEL = load_silero_vad(onnx=False)
        return _MODEL


def detect_speech(audio: np.ndarray, options: VadOptions) -> SpeechSpans:
    """Run Silero VAD over 16 kHz mono audio.

    Args:
        audio (np.ndarray): float32 samples, shape ``(n,)``.
        options (VadOptions): threshold and minimum speech length.

    Returns:
        SpeechSpans: the speech segments in seconds (3 decimals).
    """
    import torch
    from silero_vad import get_speech_timestamps

    model = _model()
    with torch.inference_mode():
        spans = get_speech_timestamps(
            torch.from_numpy(np.ascontiguousarray(audio, dtype=np.float32)),
            model,
            threshold=options.threshold,
            sampling_rate=SAMPLE_RATE,
            min_speech_duration_ms=options.min_speech_ms,
        )
    model.reset_states()
    return SpeechSpans(
        tuple((round(s["start"] / SAMPLE_RATE, 3), round(s["end"] / SAMPLE_RATE, 3)) for s in spans)
    )

"""The typed boundary of transcription: options in, segments and events out."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "FALLBACK_TEMPERATURES",
    "PROMPT_TOKEN_BUDGET",
    "Segment",
    "TakeProgress",
    "TakeResult",
    "TranscribeOptions",
    "VadOptions",
    "VocabularyUsage",
    "WindowDone",
    "fit_prompt",
]

#: mlx-whisper's (and openai-whisper's) temperature fallback ladder.
FALLBACK_TEMPERATURES = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
#: Prompt tokens a window may carry: ``n_text_ctx // 2 - 1`` (openai-whisper decoding.py).
PROMPT_TOKEN_BUDGET = 223


@dataclass(frozen=True)
class VadOptions:
    """Silero VAD gate settings (reference defaults).

    Attributes:
        threshold (float): speech probability above which a 32 ms frame is speech.
        min_speech_ms (int): shortest speech run kept, milliseconds.
        trim (bool): crop the audio to the speech span +- 0.5 s before Whisper.
    """

    threshold: float = 0.5
    min_speech_ms: int = 250
    trim: bool = False


@dataclass(frozen=True)
class TranscribeOptions:
    """One take's decoding options (mlx-whisper ``transcribe`` arguments).

    Attributes:
        task (str): ``"transcribe"`` or ``"translate"`` (to English).
        language (str | None): ISO code; ``None`` detects from the first window.
        prompt (str | None): initial prompt; its last 223 tokens are kept.
        vocabulary (tuple[str, ...]): terms fitted whole after the prompt.
        temperatures (tuple[float, ...]): one value, or the fallback ladder.
        beam_size (int | None): beams at temperature 0; ``None`` is greedy.
        word_timestamps (bool): word timings by cross-attention DTW.
        condition_on_previous_text (bool): feed each window's text to the next.
        no_speech_threshold (float | None): skip windows that look silent.
        without_timestamps (bool): sample text tokens only (one segment per window).
        vad (VadOptions | None): the VAD gate; ``None`` is off.
    """

    task: str = "transcribe"
    language: str | None = None
    prompt: str | None = None
    vocabulary: tuple[str, ...] = ()
    temperatures: tuple[float, ...] = FALLBACK_TEMPERATURES
    beam_size: int | None = None
    word_timestamps: bool = False
    condition_on_previous_text: bool = True
    no_speech_threshold: float | None = 0.6
    without_timestamps: bool = False
    vad: VadOptions | None = None


@dataclass(frozen=True)
class Segment:
    """One finalized segment, openai-whisper's ``segments`` fields (seconds)."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float
    words: tuple[dict[str, Any], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """The ``verbose_json`` segment object."""
        out: dict[str, Any] = {
            "id": self.id,
            "seek": self.seek,
            "start": round(self.start, 3),
            "end": round(self.end, 3),
            "text": self.text,
            "tokens": list(self.tokens),
            "temperature": self.temperature,
            "avg_logprob": _finite(self.avg_logprob),
            "compression_ratio": _finite(self.compression_ratio),
            "no_speech_prob": _finite(self.no_speech_prob),
        }
        if self.words is not None:
            out["words"] = list(self.words)
        return out


def _finite(x: float) -> float:
    return float(x) if x == x and abs(x) != float("inf") else 0.0


@dataclass(frozen=True)
class VocabularyUsage:
    """How the ``vocabulary`` terms fitted the prompt budget."""

    included: tuple[str, ...]
    omitted: tuple[str, ...]
    token_count: int
    token_budget: int = PROMPT_TOKEN_BUDGET

    def to_json(self) -> dict[str, Any]:
        """The ``mlxspec.vocabulary`` block."""
        return {
            "included": list(self.included),
            "omitted": list(self.omitted),
            "token_count": self.token_count,
            "token_budget": self.token_budget,
        }


@dataclass(frozen=True)
class TakeProgress:
    """Mel frames decoded so far out of the take's total (``transcript.progress``)."""

    done: int
    total: int


@dataclass(frozen=True)
class TakeResult:
    """A whole take.

    Attributes:
        text (str): the transcript.
        language (str): the language decoded (given or detected).
        duration (float): seconds of audio.
        segments (tuple[Segment, ...]): every segment.
        vocabulary (VocabularyUsage | None): when ``vocabulary`` was given.
        vad (dict | None): ``{"speech", "segments"}`` when the VAD gate ran.
        load_ms (float): time spent paging the weights in for this request.
        transcribe_ms (float): time spent in Whisper (and the VAD).
    """

    text: str
    language: str
    duration: float
    segments: tuple[Segment, ...] = ()
    vocabulary: VocabularyUsage | None = None
    vad: dict[str, Any] | None = None
    load_ms: float = 0.0
    transcribe_ms: float = 0.0
    task: str = "transcribe"
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class WindowDone:
    """A decoded window: its new segments and the take's progress (mel frames)."""

    segments: tuple[Segment, ...]
    progress: TakeProgress


Emit = Callable[[WindowDone], None]


def fit_prompt(
    tokenizer: Any, prompt: str | None, vocabulary: tuple[str, ...]
) -> tuple[list[int], VocabularyUsage | None]:
    """The initial prompt's tokens: ``prompt`` then whole ``vocabulary`` terms
    while they fit :data:`PROMPT_TOKEN_BUDGET` (the reference's rule).

    Args:
        tokenizer: an mlx-whisper ``Tokenizer``.
        prompt (str | None): the request's prompt; its last 223 tokens are kept.
        vocabulary (tuple[str, ...]): recognition hints, in order.

    Returns:
        tuple[list[int], VocabularyUsage | None]: the tokens (empty for none)
        and, when ``vocabulary`` was given, how it fitted.
    """
    tokens = tokenizer.encode(" " + prompt.strip()) if prompt and prompt.strip() else []
    tokens = tokens[-PROMPT_TOKEN_BUDGET:]
    included: list[str] = []
    omitted: list[str] = []
    for term in vocabulary:
        term_tokens = tokenizer.encode((", " if included or tokens else " ") + term.strip())
        if term.strip() and len(tokens) + len(term_tokens) <= PROMPT_TOKEN_BUDGET:
            tokens += term_tokens
            included.append(term)
        else:
            omitted.append(term)
    usage = VocabularyUsage(tuple(included), tuple(omitted), len(tokens)) if vocabulary else None
    return tokens, usage

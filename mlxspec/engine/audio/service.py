"""The Whisper service: weights paged in on demand, takes run on the MLX thread.

:class:`WhisperService` owns one checkpoint. Its weights load on the first
take (a CTranslate2 checkpoint is converted once, :mod:`.checkpoint`), and are
released ``idle_unload_s`` seconds after the last take unless ``resident``.
Every take is a stepped exclusive job of the thread that owns this process's
MLX (a :class:`~.runner.SoloRunner`): a window of 30 s per step, and a client
that left stops it at the next window (``JobAbandoned``). Beside a chat model
this service lives in the Whisper worker process (:mod:`.worker`), so no take
ever holds the chat engine's thread.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import time
from collections.abc import Callable, Generator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mlxspec.engine.audio.checkpoint import WhisperCheckpoint, alignment_heads
from mlxspec.engine.audio.pcm import SAMPLE_RATE
from mlxspec.engine.audio.runner import ExclusiveRunner
from mlxspec.engine.audio.types import (
    Emit,
    TakeResult,
    TranscribeOptions,
    VocabularyUsage,
    WindowDone,
    fit_prompt,
)
from mlxspec.engine.audio.vad import SpeechSpans, detect_speech

if TYPE_CHECKING:  # mlx-whisper's import takes seconds (numba, scipy): on first use only
    from mlxspec.engine.audio.take import Take

__all__ = [
    "DEFAULT_IDLE_UNLOAD_S",
    "MIN_AUDIO_S",
    "WhisperService",
    "WindowDone",
    "vocabulary_usage",
]

logger = logging.getLogger("mlxspec.engine.audio")

#: Seconds of idleness after which the weights are released (``--whisper-idle-unload``).
DEFAULT_IDLE_UNLOAD_S = 300.0
#: Shortest clip accepted (reference: "clips shorter than 0.1 s" are a 400).
MIN_AUDIO_S = 0.1


class WhisperService:
    """One Whisper checkpoint served beside (or instead of) the chat model.

    Args:
        checkpoint (WhisperCheckpoint): what to load.
        runner (ExclusiveRunner): the thread that owns MLX.
        cache_root (Path): where conversions are cached.
        idle_unload_s (float): release the weights this long after the last
            take. Default: :data:`DEFAULT_IDLE_UNLOAD_S`.
        resident (bool): never release them. Default: ``False``.
        fp16 (bool | None): float16 weights; ``None`` picks float16 on a GPU and
            float32 on the CPU (where MLX's float16 matmul has no BLAS). Default: ``None``.
    """

    def __init__(
        self,
        checkpoint: WhisperCheckpoint,
        runner: ExclusiveRunner,
        cache_root: Path,
        *,
        idle_unload_s: float = DEFAULT_IDLE_UNLOAD_S,
        resident: bool = False,
        fp16: bool | None = None,
    ) -> None:
        self.checkpoint, self.runner, self.cache_root = checkpoint, runner, cache_root
        self.idle_unload_s, self.resident = idle_unload_s, resident
        self._fp16 = fp16
        self.model: Any = None  # touched on the MLX thread only
        self.loads = self.unloads = self.requests = 0
        self.last_load_ms = 0.0
        self.created = int(time.time())
        #: takes and open sessions holding the weights (no idle release meanwhile)
        self.holds = 0
        self._idle: asyncio.TimerHandle | None = None

    @property
    def model_id(self) -> str:
        """The checkpoint's id (``/v1/models``, responses)."""
        return self.checkpoint.model_id

    @property
    def fp16(self) -> bool:
        """Whether the weights and activations are float16."""
        if self._fp16 is None:
            import mlx.core as mx

            self._fp16 = mx.default_device() == mx.gpu
        return self._fp16

    @property
    def multilingual(self) -> bool:
        """Whether the checkpoint knows languages other than English (an
        ``.en`` checkpoint does not; the loaded model says so itself)."""
        if self.model is not None:
            return bool(self.model.is_multilingual)
        return not self.model_id.endswith(".en")

    def vocabulary_usage(
        self, vocabulary: tuple[str, ...], prompt: str | None
    ) -> VocabularyUsage | None:
        """How ``vocabulary`` fits the prompt budget after ``prompt``
        (:func:`~.types.fit_prompt` with the checkpoint's tokenizer).

        Args:
            vocabulary (tuple[str, ...]): recognition hints, in order.
            prompt (str | None): the request's prompt.

        Returns:
            VocabularyUsage | None: the terms kept and left out; ``None`` for no vocabulary.
        """
        return vocabulary_usage(self.multilingual, vocabulary, prompt)

    def block(self) -> dict[str, Any]:
        """The ``transcription`` block of ``/stats``, ``/health`` and the unload route."""
        return {
            "model": self.model_id,
            "loaded": self.model is not None,
            "resident": self.resident,
            "loads": self.loads,
            "unloads": self.unloads,
            "requests": self.requests,
            "last_load_ms": round(self.last_load_ms, 3),
            "idle_unload_sec": None if self.resident else self.idle_unload_s,
        }

    def close(self) -> None:
        """Stop the runner's thread when it is one of ours (a :class:`~.runner.SoloRunner`)."""
        if hasattr(self.runner, "close"):
            self.runner.close()

    def sessions(self, max_audio_s: float | None, idle_s: float | None) -> Any:
        """The dictation sessions of this service (:class:`~.sessions.Sessions`)."""
        from mlxspec.engine.audio.sessions import Sessions

        return Sessions(self, max_audio_s, idle_s=idle_s)

    # MLX thread
    def _load(self) -> float:
        """Page the weights in if needed; the milliseconds it took (0 when loaded)."""
        if self.model is not None:
            return 0.0
        import mlx.core as mx
        from mlx.utils import tree_map
        from mlx_whisper.load_models import load_model

        started = time.perf_counter()
        folder = self.checkpoint.mlx_folder(self.cache_root)
        dtype = mx.float16 if self.fp16 else mx.float32
        model = load_model(str(folder), dtype=dtype)
        floating = mx.floating  # the alignment heads are integer indices: kept as they are
        model.update(
            tree_map(
                lambda a: a.astype(dtype) if mx.issubdtype(a.dtype, floating) else a,
                model.parameters(),
            )
        )
        mx.eval(model.parameters())
        dims = json.loads((folder / "config.json").read_text())
        if (heads := alignment_heads(folder, dims)) is not None:
            model.set_alignment_heads(np.array(heads, dtype=np.int64))
        self.model = model
        self.loads += 1
        self.last_load_ms = (time.perf_counter() - started) * 1000
        logger.info("Whisper %s loaded in %.0f ms", self.model_id, self.last_load_ms)
        return self.last_load_ms

    def _unload(self) -> bool:
        if self.model is None:
            return False
        import mlx.core as mx

        self.model = None
        gc.collect()
        mx.clear_cache()
        self.unloads += 1
        logger.info("Whisper %s unloaded", self.model_id)
        return True

    # event loop
    async def unload(self) -> bool:
        """Release the weights now (``/admin/transcription/unload``); whether they were loaded."""
        self._cancel_idle()
        return bool(await self.runner.run_exclusive(self._unload))

    async def load(self) -> float:
        """Page the weights in now; the milliseconds it took."""
        self._cancel_idle()
        return float(await self.runner.run_exclusive(self._load))

    def hold(self) -> None:
        """Keep the weights while a take or a session runs."""
        self.holds += 1
        self._cancel_idle()

    def release(self) -> None:
        """End a :meth:`hold`; the last one arms the idle release."""
        self.holds = max(0, self.holds - 1)
        if self.holds == 0 and not self.resident:
            self._cancel_idle()
            loop = asyncio.get_running_loop()
            self._idle = loop.call_later(self.idle_unload_s, self._idle_release)

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_release(self) -> None:
        self._idle = None
        if self.holds == 0:
            asyncio.ensure_future(self.unload())

    async def run(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` (plain or stepped) on the MLX thread with the weights held."""
        self.hold()
        try:
            return await self.runner.run_exclusive(fn)
        finally:
            self.release()

    async def transcribe(
        self, audio: np.ndarray, options: TranscribeOptions, emit: Emit | None = None
    ) -> TakeResult:
        """Transcribe (or translate) a whole clip.

        Args:
            audio (np.ndarray): 16 kHz mono float32 samples.
            options (TranscribeOptions): decoding and VAD options.
            emit (Emit | None): called on the event loop after each window.
                Default: ``None``.

        Returns:
            TakeResult: text, segments, language and timings.

        Raises:
            JobAbandoned: the caller was cancelled (the take stopped at a window).
        """
        self.requests += 1
        loop = asyncio.get_running_loop()

        def relay(done: WindowDone) -> None:
            if emit is not None:
                loop.call_soon_threadsafe(emit, done)

        return await self.run(lambda: self._take(audio, options, relay))

    def _take(
        self, audio: np.ndarray, options: TranscribeOptions, emit: Emit
    ) -> Generator[None, None, TakeResult]:
        started = time.perf_counter()
        duration = len(audio) / SAMPLE_RATE
        spans, offset = None, 0.0
        if options.vad is not None:  # before the weights: silence never pages them in
            spans = detect_speech(audio, options.vad)
            if not spans.speech:
                return _silent(options, duration, spans, started)
            if options.vad.trim:
                offset, end = spans.crop(duration)
                audio = audio[int(offset * SAMPLE_RATE) : int(end * SAMPLE_RATE)]
        load_ms = self._load()
        yield
        from mlxspec.engine.audio.take import Take

        take = Take(self.model, options, fp16=self.fp16, time_offset=offset)
        take.feed(audio)
        while take.ready(final=True):
            segments = take.step(final=True) or []
            emit(WindowDone(tuple(segments), take.progress()))
            yield
        return result_of(take, duration, spans, load_ms, started)


def vocabulary_usage(
    multilingual: bool, vocabulary: tuple[str, ...], prompt: str | None
) -> VocabularyUsage | None:
    """How ``vocabulary`` fits the prompt budget after ``prompt`` with Whisper's
    tokenizer (multilingual or English; no weights needed).

    Returns:
        VocabularyUsage | None: the terms kept and left out; ``None`` for no vocabulary.
    """
    if not vocabulary:
        return None
    from mlx_whisper.tokenizer import get_tokenizer

    tokenizer = get_tokenizer(multilingual, num_languages=99)
    return fit_prompt(tokenizer, prompt, vocabulary)[1]


def _silent(
    options: TranscribeOptions, duration: float, spans: SpeechSpans, started: float
) -> TakeResult:
    """No speech heard: an empty transcript, Whisper never ran."""
    return TakeResult(
        text="",
        language=options.language or "unknown",
        duration=duration,
        vad=spans.to_json(),
        transcribe_ms=(time.perf_counter() - started) * 1000,
        task=options.task,
    )


def result_of(
    take: Take, duration: float, spans: SpeechSpans | None, load_ms: float, started: float
) -> TakeResult:
    """A finished take's :class:`TakeResult`."""
    return TakeResult(
        text=take.text,
        language=take.language or "en",
        duration=duration,
        segments=tuple(take.segments),
        vocabulary=take.vocabulary,
        vad=None if spans is None else spans.to_json(),
        load_ms=load_ms,
        transcribe_ms=max(0.0, (time.perf_counter() - started) * 1000 - load_ms),
        task=take.options.task,
    )

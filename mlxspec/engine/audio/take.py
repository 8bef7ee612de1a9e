"""One take: Whisper's 30 s window loop over a growing audio buffer.

This is mlx-whisper's ``transcribe`` (``mlx_whisper/transcribe.py``) cut into
steps, composed from its pieces (``log_mel_spectrogram``, ``DecodingOptions``,
``model.decode``, ``add_word_timestamps``, the tokenizer): the temperature
fallback ladder (compression ratio 2.4, log probability -1.0, no-speech 0.6),
the seek that follows the last timestamp token, and the previous window's text
as the next one's prompt. Each :meth:`Take.step` decodes one window, so the
engine runs a window per turn (between chat decode steps) and a client that
left stops the take at the next window. A dictation session feeds audio as it
arrives and steps as soon as a whole window exists beyond the seek.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import numpy as np
from mlx_whisper.audio import (
    HOP_LENGTH,
    N_FRAMES,
    N_SAMPLES,
    SAMPLE_RATE,
    log_mel_spectrogram,
    pad_or_trim,
)
from mlx_whisper.decoding import DecodingOptions, DecodingResult
from mlx_whisper.tokenizer import get_tokenizer

from mlxspec.engine.audio.beam import BeamDecodingTask
from mlxspec.engine.audio.types import (
    Segment,
    TakeProgress,
    TranscribeOptions,
    VocabularyUsage,
    fit_prompt,
)

__all__ = ["Take"]

_COMPRESSION_RATIO_THRESHOLD = 2.4
_LOGPROB_THRESHOLD = -1.0
_PREPEND = "\"'“¿([{-"
_APPEND = "\"'.。,，!！?？:：”)]}、"
#: STFT frames past a window's end that must be real audio before a session
#: decodes it early (the last frames' 400-sample analysis reaches past the buffer).
_SESSION_MARGIN_FRAMES = 3


class Take:
    """The state of one transcription: audio, seek, tokens and segments.

    Args:
        model: an ``mlx_whisper.whisper.Whisper`` (alignment heads set).
        options (TranscribeOptions): the decoding options.
        fp16 (bool): run in float16 (GPU) rather than float32 (CPU).
        time_offset (float): seconds added to every timestamp (a VAD crop's start).
    """

    def __init__(
        self, model: Any, options: TranscribeOptions, *, fp16: bool, time_offset: float = 0.0
    ) -> None:
        self.model, self.options, self.fp16 = model, options, fp16
        self.dtype = mx.float16 if fp16 else mx.float32
        self.time_offset = time_offset
        self.audio = np.zeros(0, dtype=np.float32)
        self._mel: mx.array | None = None
        self._mel_samples = -1
        self.seek = 0
        self.language: str | None = None if model.is_multilingual else "en"
        if options.language is not None:
            self.language = options.language
        self._tokenizer: Any = None
        self.all_tokens: list[int] = []
        self.prompt_tokens: list[int] = []
        self.vocabulary: VocabularyUsage | None = None
        self.prompt_reset_since = 0
        self.segments: list[Segment] = []
        self.last_speech_timestamp = 0.0

    # audio
    def feed(self, samples: np.ndarray) -> None:
        """Append 16 kHz mono float32 samples."""
        self.audio = np.concatenate([self.audio, samples.astype(np.float32, copy=False)])

    @property
    def duration(self) -> float:
        """Seconds of audio fed."""
        return len(self.audio) / SAMPLE_RATE

    @property
    def content_frames(self) -> int:
        """Mel frames of real audio (log-mel of ``n`` samples has ``n // 160`` frames)."""
        return len(self.audio) // HOP_LENGTH

    def progress(self) -> TakeProgress:
        """Mel frames decoded out of those fed."""
        return TakeProgress(min(self.seek, self.content_frames), self.content_frames)

    def _mel_now(self) -> mx.array:
        if self._mel_samples != len(self.audio):
            # Whisper pads 30 s of silence for slicing (mlx-whisper transcribe)
            self._mel = log_mel_spectrogram(
                self.audio, n_mels=self.model.dims.n_mels, padding=N_SAMPLES
            )
            self._mel_samples = len(self.audio)
        assert self._mel is not None
        return self._mel

    def ready(self, final: bool) -> bool:
        """Whether a window can be decoded now: a whole 30 s beyond the seek
        (plus the STFT margin), or, once the audio is complete, any left."""
        if final:
            return self.seek < self.content_frames
        return self.content_frames >= self.seek + N_FRAMES + _SESSION_MARGIN_FRAMES

    # decoding
    def _tokenizer_for(self, language: str) -> Any:
        if self._tokenizer is None:
            self._tokenizer = get_tokenizer(
                self.model.is_multilingual,
                num_languages=self.model.num_languages,
                language=language,
                task=self.options.task,
            )
            self.prompt_tokens, self.vocabulary = fit_prompt(
                self._tokenizer, self.options.prompt, self.options.vocabulary
            )
            self.all_tokens = list(self.prompt_tokens)
        return self._tokenizer

    def _detect_language(self, features: mx.array) -> str:
        """The most probable language of the first window (its encoded features)."""
        _, probs = self.model.detect_language(features[0])
        return max(probs, key=probs.get)

    def _decode(self, segment: mx.array) -> DecodingResult:
        """One window through the temperature ladder (mlx-whisper ``decode_with_fallback``)."""
        opts = self.options
        result: DecodingResult | None = None
        for t in opts.temperatures:
            options = DecodingOptions(
                task=opts.task,
                language=self.language,
                temperature=t,
                prompt=self.all_tokens[self.prompt_reset_since :],
                without_timestamps=opts.without_timestamps,
                fp16=self.fp16,
                beam_size=opts.beam_size if t == 0 and opts.beam_size else None,
            )
            if options.beam_size:
                result = BeamDecodingTask(self.model, options).run(segment[None])[0]
            else:
                result = self.model.decode(segment, options)
            needs_fallback = result.compression_ratio > _COMPRESSION_RATIO_THRESHOLD
            needs_fallback |= result.avg_logprob < _LOGPROB_THRESHOLD
            if opts.no_speech_threshold is not None and (
                result.no_speech_prob > opts.no_speech_threshold
            ):
                needs_fallback = False  # silence
            if not needs_fallback:
                break
        assert result is not None
        return result

    def step(self, final: bool) -> list[Segment] | None:
        """Decode the next window if :meth:`ready`; returns its new segments
        (maybe none: a silent window), or ``None`` when no window was ready."""
        if not self.ready(final):
            return None
        mel = self._mel_now()
        content_frames = self.content_frames
        seek = self.seek
        segment_size = min(N_FRAMES, content_frames - seek)
        mel_segment = pad_or_trim(mel[seek : seek + segment_size], N_FRAMES, axis=-2)
        mel_segment = mel_segment.astype(self.dtype)
        # encode once: language detection and every rung of the ladder reuse it
        # (mlx-whisper's decode skips its encoder when given encoded features)
        features = self.model.encoder(mel_segment[None])
        mx.eval(features)
        if self.language is None:
            self.language = self._detect_language(features)
        tokenizer = self._tokenizer_for(self.language)
        result = self._decode(features[0])
        threshold = self.options.no_speech_threshold
        if threshold is not None and result.no_speech_prob > threshold:
            if result.avg_logprob <= _LOGPROB_THRESHOLD:  # silent: skip the window
                self.seek += segment_size
                return []
        current, self.seek = self._split(result, seek, segment_size, tokenizer)
        if self.options.word_timestamps and current:
            # numba (its DTW) and scipy load only when word timings are asked for
            from mlx_whisper.timing import add_word_timestamps

            words_in = [dict(s) for s in current]
            add_word_timestamps(
                segments=words_in,
                model=self.model,
                tokenizer=tokenizer,
                mel=mel_segment,
                num_frames=segment_size,
                prepend_punctuations=_PREPEND,
                append_punctuations=_APPEND,
                last_speech_timestamp=self.last_speech_timestamp,
            )
            current = words_in
            ends = [w["end"] for s in current for w in s.get("words", [])]
            if ends:
                self.last_speech_timestamp = ends[-1]
        return self._finalize(current, result)

    def _split(
        self, result: DecodingResult, seek: int, segment_size: int, tokenizer: Any
    ) -> tuple[list[dict[str, Any]], int]:
        """Cut a window's tokens into segments at timestamp pairs; the new seek."""
        tokens = np.array(result.tokens)
        time_offset = seek * HOP_LENGTH / SAMPLE_RATE
        precision = N_FRAMES // self.model.dims.n_audio_ctx * HOP_LENGTH / SAMPLE_RATE
        is_ts = tokens >= tokenizer.timestamp_begin
        single_ending = is_ts[-2:].tolist() == [False, True]
        consecutive = (np.where(np.logical_and(is_ts[:-1], is_ts[1:]))[0] + 1).tolist()

        def piece(start: float, end: float, toks: np.ndarray) -> dict[str, Any]:
            text = tokenizer.decode([t for t in toks.tolist() if t < tokenizer.eot])
            return {"seek": seek, "start": start, "end": end, "text": text,
                    "tokens": toks.tolist()}  # fmt: skip

        out = []
        if consecutive:
            slices = consecutive + ([len(tokens)] if single_ending else [])
            last = 0
            for cut in slices:
                part = tokens[last:cut]
                start = time_offset + (int(part[0]) - tokenizer.timestamp_begin) * precision
                end = time_offset + (int(part[-1]) - tokenizer.timestamp_begin) * precision
                out.append(piece(start, end, part))
                last = cut
            if single_ending:
                new_seek = seek + segment_size
            else:  # the window's unfinished tail is decoded again from its last timestamp
                new_seek = seek + (int(tokens[last - 1]) - tokenizer.timestamp_begin) * 2
        else:
            duration = segment_size * HOP_LENGTH / SAMPLE_RATE
            stamps = tokens[is_ts]
            if len(stamps) and int(stamps[-1]) != tokenizer.timestamp_begin:
                duration = (int(stamps[-1]) - tokenizer.timestamp_begin) * precision
            out.append(piece(time_offset, time_offset + duration, tokens))
            new_seek = seek + segment_size
        return out, new_seek

    def _finalize(self, current: list[dict[str, Any]], result: DecodingResult) -> list[Segment]:
        new = []
        for s in current:
            blank = s["start"] == s["end"] or not s["text"].strip()
            words = s.get("words") if self.options.word_timestamps else None
            segment = Segment(
                id=len(self.segments),
                seek=s["seek"],
                start=s["start"] + self.time_offset,
                end=s["end"] + self.time_offset,
                text="" if blank else s["text"],
                tokens=() if blank else tuple(s["tokens"]),
                temperature=float(result.temperature),
                avg_logprob=float(result.avg_logprob),
                compression_ratio=float(result.compression_ratio),
                no_speech_prob=float(result.no_speech_prob),
                words=None if words is None else tuple(self._shift(w) for w in words),
            )
            self.segments.append(segment)
            self.all_tokens.extend(segment.tokens)
            if not blank:
                new.append(segment)
        if not self.options.condition_on_previous_text or result.temperature > 0.5:
            self.prompt_reset_since = len(self.all_tokens)  # no prompt after a hot window
        return new

    def _shift(self, word: dict[str, Any]) -> dict[str, Any]:
        return {
            "word": word["word"],
            "start": round(float(word["start"]) + self.time_offset, 3),
            "end": round(float(word["end"]) + self.time_offset, 3),
            "probability": round(float(word["probability"]), 4),
        }

    @property
    def text(self) -> str:
        """The transcript so far (mlx-whisper decodes all tokens after the prompt)."""
        if self._tokenizer is None:
            return ""
        tokens = self.all_tokens[len(self.prompt_tokens) :]
        return self._tokenizer.decode([t for t in tokens if t < self._tokenizer.eot])

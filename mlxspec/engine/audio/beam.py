"""Beam search for mlx-whisper's decoder, which implements only greedy decoding.

A port of openai-whisper's ``BeamSearchDecoder`` (``whisper/decoding.py``, MIT):
each beam proposes its ``beam_size + 1`` best next tokens, the ``beam_size``
best unfinished sequences go on, finished ones are kept until ``beam_size *
patience`` exist, and the KV cache follows the surviving beams. Sequences are
ranked by mlx-whisper's ``MaximumLikelihoodRanker``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map
from mlx_whisper.decoding import DecodingOptions, DecodingResult, DecodingTask, compression_ratio

__all__ = ["BeamDecodingTask"]


class _Beams:
    """Beam bookkeeping for one audio input (a batch of one window)."""

    def __init__(self, beam_size: int, eot: int, patience: float | None) -> None:
        self.beam_size, self.eot = beam_size, eot
        self.max_candidates = round(beam_size * (patience or 1.0))
        self.finished: dict[tuple[int, ...], float] = {}

    def update(
        self, tokens: np.ndarray, logprobs: np.ndarray, sums: np.ndarray
    ) -> tuple[list[list[int]], list[float], list[int], bool]:
        scores: dict[tuple[int, ...], float] = {}
        sources: dict[tuple[int, ...], int] = {}
        for j in range(tokens.shape[0]):
            prefix = tokens[j].tolist()
            for token in np.argsort(-logprobs[j])[: self.beam_size + 1]:
                sequence = (*prefix, int(token))
                scores[sequence] = float(sums[j] + logprobs[j, token])
                sources[sequence] = j
        kept, kept_sums, kept_sources, newly = [], [], [], {}
        for sequence in sorted(scores, key=scores.__getitem__, reverse=True):
            if sequence[-1] == self.eot:
                newly[sequence] = scores[sequence]
            else:
                kept.append(list(sequence))
                kept_sums.append(scores[sequence])
                kept_sources.append(sources[sequence])
                if len(kept) == self.beam_size:
                    break
        for sequence in sorted(newly, key=newly.__getitem__, reverse=True):
            if len(self.finished) >= self.max_candidates:
                break
            self.finished[sequence] = newly[sequence]
        return kept, kept_sums, kept_sources, len(self.finished) >= self.max_candidates


class BeamDecodingTask(DecodingTask):
    """mlx-whisper's ``DecodingTask`` with ``options.beam_size`` beams at temperature 0.

    Args:
        model: an ``mlx_whisper.whisper.Whisper``.
        options (DecodingOptions): with ``beam_size`` set and ``temperature == 0``.
    """

    def __init__(self, model: Any, options: DecodingOptions) -> None:
        super().__init__(model, replace(options, beam_size=None, patience=None))
        self.options = options
        self.n_group = int(options.beam_size or 1)

    def run(self, mel: mx.array) -> list[DecodingResult]:
        """Decode one window (``mel`` shape ``(1, 3000, n_mels)``) by beam search."""
        tokenizer = self.tokenizer
        self.inference.reset()
        features = self._get_audio_features(mel)
        # one copy per beam: the cross-attention KV cache is reordered with the beams
        beams_features = mx.repeat(features, self.n_group, axis=0)
        beams = _Beams(self.n_group, tokenizer.eot, self.options.patience)
        tokens = np.tile(np.array(self.initial_tokens, dtype=np.int32), (self.n_group, 1))
        sums = np.zeros(self.n_group, dtype=np.float32)
        no_speech = float("nan")
        inputs = mx.array(tokens)
        for step in range(self.sample_len):
            logits_all = self.inference.logits(inputs, beams_features)
            if step == 0 and tokenizer.no_speech is not None:
                at_sot = mx.softmax(logits_all[0, self.sot_index], axis=-1)
                no_speech = float(np.array(at_sot[tokenizer.no_speech]))
            logits = logits_all[:, -1]
            current = mx.array(tokens)
            for logit_filter in self.logit_filters:
                logits = logit_filter.apply(logits, current)
            logprobs = np.array(logits - mx.logsumexp(logits, axis=-1, keepdims=True))
            kept, kept_sums, sources, done = beams.update(tokens, logprobs, sums)
            if done or not kept or len(kept[0]) > self.n_ctx:
                break
            if len(kept) < self.n_group:  # every other candidate finished
                break
            index = mx.array(sources)
            self.inference.kv_cache = tree_map(lambda x, i=index: x[i], self.inference.kv_cache)
            tokens, sums = np.array(kept, dtype=np.int32), np.array(kept_sums, dtype=np.float32)
            inputs = mx.array(tokens[:, -1:])
        if len(beams.finished) < self.n_group:  # out of steps: the live beams end here
            for j in np.argsort(-sums):
                beams.finished.setdefault((*tokens[j].tolist(), tokenizer.eot), float(sums[j]))
                if len(beams.finished) >= self.n_group:
                    break
        candidates = [list(seq[self.sample_begin :]) for seq in beams.finished]
        candidates = [c[: c.index(tokenizer.eot)] if tokenizer.eot in c else c for c in candidates]
        scores = list(beams.finished.values())
        best = int(self.sequence_ranker.rank([candidates], [scores])[0])
        chosen, text = candidates[best], tokenizer.decode(candidates[best]).strip()
        return [
            DecodingResult(
                audio_features=features[0],
                language=self.options.language or "en",
                tokens=chosen,
                text=text,
                avg_logprob=scores[best] / (len(chosen) + 1),
                no_speech_prob=no_speech,
                temperature=0.0,
                compression_ratio=compression_ratio(text),
            )
        ]

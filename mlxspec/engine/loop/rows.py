"""Per-request output bookkeeping, shared by the serial and batched lanes.

A :class:`Row` turns the token stream of one request into events: it
reports logprobs, recognises EOS, detokenizes incrementally (multi-byte
UTF-8 held back by mlx-lm's streaming detokenizer), matches stop strings on
text and emits :class:`~.types.Delta` / :class:`~.types.Finished`. A token's
logprob entry is sent with the text it wrote (:class:`~.stops.HeldLogprobs`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import TYPE_CHECKING, Any, NamedTuple, cast

from mlxspec.engine.adapters.registry import NO_ADAPTER, AdapterPick
from mlxspec.engine.loop.stops import HeldLogprobs, StopMatcher
from mlxspec.engine.types import Delta, Finished, GenerationRequest, TokenLogprob, TopLogprob

if TYPE_CHECKING:
    from mlxspec.engine.loop.handles import RequestHandle
    from mlxspec.engine.sampling.grammar import GrammarProcessor
    from mlxspec.engine.speculative.fill import FillCounts
    from mlxspec.engine.speculative.speculator import SpecCounts


#: Reported for a log-probability that is not finite (OpenAI's value for an
#: impossible token); NaN and -Infinity are not JSON.
LOGPROB_FLOOR = -9999.0


def finite_logprob(value: float) -> float:
    """``value``, or :data:`LOGPROB_FLOOR` when it is -inf or NaN (a zero
    probability, or float32 logits overflowed by extreme penalties or biases)."""
    return value if math.isfinite(value) else LOGPROB_FLOOR


#: SentencePiece's word-boundary marker, which decodes to a space.
_SPM_SPACE = "\u2581".encode()


def piece_bytes(detokenizer: Any, tokenizer: Any, token: int, piece: str | None) -> bytes:
    """The bytes token ``token`` decodes to on its own, partial UTF-8 kept.

    Uses the same maps as mlx-lm's streaming detokenizers: GPT-2 byte-level
    BPE pieces through the byte decoder, SentencePiece pieces with ``▁`` as a
    space and ``<0xNN>`` byte tokens; other tokenizers through ``decode``
    (where a partial UTF-8 sequence is already lost to U+FFFD).

    Args:
        detokenizer: the row's mlx-lm ``StreamingDetokenizer`` (selects the map).
        tokenizer: the mlx-lm ``TokenizerWrapper``.
        token (int): the token id.
        piece (str | None): its raw vocabulary piece (``None`` past the vocabulary).

    Returns:
        bytes: the token's bytes (special tokens: their text in UTF-8).
    """
    from mlx_lm.tokenizer_utils import (
        BPEStreamingDetokenizer,
        SPMStreamingDetokenizer,
        _byte_decoder,
    )

    if piece is None:  # an id past the tokenizer's vocabulary (padded embedding rows)
        return b""
    if isinstance(detokenizer, BPEStreamingDetokenizer):
        table = _byte_decoder()
        return b"".join(bytes([table[c]]) if c in table else c.encode() for c in piece)
    if isinstance(detokenizer, SPMStreamingDetokenizer) and token < len(detokenizer.tokenmap):
        return detokenizer.tokenmap[token].replace(_SPM_SPACE, b" ")
    return tokenizer.decode([token]).encode()


def keep_leading_space(detokenizer: Any) -> None:
    """Stop an mlx-lm BPE or SPM streaming detokenizer from dropping the space
    that starts its first text (it does so while its ``text`` is empty): its
    text is seeded with a character that ``last_segment`` has already passed,
    so it is never emitted. The naive detokenizer keeps what ``decode`` gives.

    Args:
        detokenizer: a fresh mlx-lm ``StreamingDetokenizer``.
    """
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer

    if isinstance(detokenizer, (BPEStreamingDetokenizer, SPMStreamingDetokenizer)):
        detokenizer.text, detokenizer.offset = "\n", 1


class StepLogprobs(NamedTuple):
    """One token's log-probability and its top candidates, read to the host.

    The batched decode step reads these for all its reporting rows at once
    (:func:`~mlxspec.engine.sampling.batch_sampler.logprob_rows`); the lone
    lane reads them from its row of log-probabilities (:func:`read_logprobs`).

    Attributes:
        value (float): the token's log-probability.
        ids (list[int]): candidate ids, by descending log-probability (at
            least as many as the row reports).
        values (list[float]): their log-probabilities.
    """

    value: float
    ids: list[int]
    values: list[float]


def read_logprobs(token: int, logprobs: Any, top_k: int) -> StepLogprobs:
    """Read ``token``'s log-probability and the ``top_k`` most likely ids.

    Args:
        token (int): the generated token id.
        logprobs (mx.array): shape ``(vocab,)``, float, log-softmax of the logits
            after logits processors and before the sampler (mlx-lm ``generate_step``).
        top_k (int): how many candidates to read; ``0`` for none.

    Returns:
        StepLogprobs: candidates by descending log-probability.
    """
    import mlx.core as mx

    ids: list[int] = []
    values: list[float] = []
    if top_k > 0:
        part = mx.argpartition(-logprobs, kth=top_k - 1)[:top_k]
        top = logprobs[part]
        order = mx.argsort(-top)
        ids = cast(list[int], part[order].tolist())  # [top_k]
        values = cast(list[float], top[order].tolist())
    return StepLogprobs(logprobs[token].item(), ids, values)


def logprob_entry(
    tokenizer: Any, token: int, step: StepLogprobs, top_k: int, detokenizer: Any = None
) -> TokenLogprob:
    """The :class:`~.types.TokenLogprob` of ``token`` from what was read.

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper`` (for raw vocab pieces).
        token (int): the generated token id.
        step (StepLogprobs): its log-probability and candidates.
        top_k (int): how many candidates to report (the first of ``step``'s).
        detokenizer: the request's streaming detokenizer, which selects how a
            piece maps to bytes (:func:`piece_bytes`). Default: ``None``
            (``tokenizer.detokenizer``).

    Returns:
        TokenLogprob: with ``top`` sorted by descending log-probability and
        each token's bytes; a non-finite value is reported as :data:`LOGPROB_FLOOR`.
    """
    detok = tokenizer.detokenizer if detokenizer is None else detokenizer
    top: tuple[TopLogprob, ...] = ()
    if top_k > 0:
        ids, vals = step.ids[:top_k], step.values[:top_k]
        pieces = tokenizer.convert_ids_to_tokens(ids)
        top = tuple(
            TopLogprob(i, p, finite_logprob(v), piece_bytes(detok, tokenizer, i, p))
            for i, p, v in zip(ids, pieces, vals, strict=True)
        )
    piece = tokenizer.convert_ids_to_tokens([token])[0]
    return TokenLogprob(
        token,
        finite_logprob(step.value),
        top,
        piece_bytes(detok, tokenizer, token, piece),
    )


def token_logprob(
    tokenizer: Any, token: int, logprobs: Any, top_k: int, detokenizer: Any = None
) -> TokenLogprob:
    """Log-probability of ``token`` and, if ``top_k > 0``, the top-k candidates
    (:func:`read_logprobs`, then :func:`logprob_entry`).

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper`` (for raw vocab pieces).
        token (int): the generated token id.
        logprobs (mx.array): shape ``(vocab,)``, float, log-softmax of the logits
            after logits processors and before the sampler (mlx-lm ``generate_step``).
        top_k (int): how many candidates to report; ``0`` for none.
        detokenizer: the request's streaming detokenizer. Default: ``None``.

    Returns:
        TokenLogprob: see :func:`logprob_entry`.
    """
    step = read_logprobs(token, logprobs, top_k)
    return logprob_entry(tokenizer, token, step, top_k, detokenizer)


class Row:
    """The output side of one running request.

    Args:
        handle (RequestHandle): where events go.
        tokenizer: an mlx-lm ``TokenizerWrapper``.
        eos (Collection[int]): end-of-sequence token ids.
        lane (str): ``"serial"`` or ``"batched"``, reported in ``Finished``
            (``"serial"`` becomes ``"serial+spec"`` once drafts were kept).
        grammar (GrammarProcessor | None): the request's grammar, which also
            ends it (``"stop"``) once only a stop token may follow. Default: ``None``.
        cached (int): prompt tokens served from the prompt cache, reported in
            ``Finished``. Default: ``0``.
    """

    def __init__(
        self,
        handle: RequestHandle,
        tokenizer: Any,
        eos: Collection[int],
        lane: str = "serial",
        grammar: GrammarProcessor | None = None,
        cached: int = 0,
    ) -> None:
        self.handle = handle
        self.lane = lane
        self.cached = cached
        self.request: GenerationRequest = handle.request
        self._tokenizer = tokenizer
        self._eos = eos
        self._detok = tokenizer.detokenizer
        if self.request.continuation:
            keep_leading_space(self._detok)
        self._stops = StopMatcher(self.request.stop)
        want = self.request.logprobs or self.request.top_logprobs > 0
        self._held = HeldLogprobs() if want else None
        self._grammar = grammar
        self.count = 0
        self.done = False
        #: Called once just before ``Finished`` is emitted (the lanes keep the
        #: KV cache here, so a client that got its answer finds it kept).
        self.before_finish: Callable[[], None] | None = None
        #: The LoRA adapters its model calls select (``lanes.start_request`` sets it).
        self.pick: AdapterPick = NO_ADAPTER
        #: Its speculation counters, when it may speculate (``lanes.start_request``).
        self.spec: SpecCounts | None = None
        #: Its fast-forwarding counters, when it may fill (``--fill strict``).
        self.fill: FillCounts | None = None

    def push(self, token: int, logprobs: Any) -> bool:
        """Consume one generated token.

        Args:
            token (int): the sampled token id.
            logprobs (mx.array | StepLogprobs | None): shape ``(vocab,)``, the
                step's log-probabilities, or what the batched step read of
                them (``None`` when the request reports none).

        Returns:
            bool: True when the request ended here (EOS, a stop string or a
            complete grammar); the ``Finished`` event has then been emitted.
        """
        self.count += 1
        if self.fill is not None:
            self.fill.take()
        entry = None
        if self._held is not None:
            k = self.request.top_logprobs
            step = logprobs if isinstance(logprobs, StepLogprobs) else None
            if step is None:
                step = read_logprobs(token, logprobs, k)
            entry = logprob_entry(self._tokenizer, token, step, k, self._detok)
        if token in self._eos:
            eos = replace(entry, eos=True) if entry is not None else None
            self._finish("stop", flush=True, eos=eos)
            return True
        self._detok.add_token(token)
        segment = self._detok.last_segment
        text = self._stops.feed(segment)
        lps: tuple[TokenLogprob, ...] = ()
        if self._held is not None:
            lps = self._held.push(entry, segment, text, stopped=self._stops.stopped, end=False)
        if text or entry is not None:
            self.handle.emit(Delta(text, (token,), lps))
        if self._stops.stopped:
            self._finish("stop", flush=False)
            return True
        if self._grammar is not None:
            # Normally accepted already: the lanes run the processor for the next
            # step before handing this token out.
            self._grammar.advance(self.count - 1, token)
            if self._grammar.done:
                self._finish("stop", flush=True)
                return True
        return False

    def finish_length(self) -> None:
        """End the request because its token budget is spent."""
        self._finish("length", flush=True)

    def _finish(self, reason: str, *, flush: bool, eos: TokenLogprob | None = None) -> None:
        """Emit the held text (``flush``) and ``Finished``; ``eos`` is the EOS
        token's logprob entry, sent last, after those of the held text."""
        if self.done:
            return
        self.done = True
        if flush:
            self._detok.finalize()
            segment = self._detok.last_segment
            tail = self._stops.feed(segment) + self._stops.flush()
            stopped = self._stops.stopped
            ids: tuple[int, ...] = ()
            lps: tuple[TokenLogprob, ...] = ()
            if self._held is not None:
                lps = self._held.push(None, segment, tail, stopped=stopped, end=True)
            if eos is not None:
                ids, lps = (eos.id,), (*lps, eos)
            if tail or lps:
                self.handle.emit(Delta(tail, ids, lps))
            if stopped:
                reason = "stop"
        prompt = len(self.request.prompt)
        if self.before_finish is not None:
            self.before_finish()
        lane, spec = self.lane, self.spec
        if spec is not None and lane == "serial" and spec.accepted > 0:
            lane = "serial+spec"  # the reference's lane: alone, and drafts helped
        finished = Finished(
            reason,  # type: ignore[arg-type]
            prompt,
            self.count,
            cached_tokens=self.cached,
            lane=lane,
            stop_sequence=self._stops.matched,
            speculation=None if spec is None else spec.frozen(),
            fill=None if self.fill is None else self.fill.frozen(self.count),
        )
        self.handle.emit(finished)

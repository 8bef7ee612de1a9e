"""Per-request output bookkeeping, shared by the serial and batched lanes.

A :class:`Row` turns the token stream of one request into events: it
reports logprobs, recognises EOS, detokenizes incrementally (multi-byte
UTF-8 held back by mlx-lm's streaming detokenizer), matches stop strings on
text and emits :class:`~.types.Delta` / :class:`~.types.Finished`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .stops import StopMatcher
from .types import Delta, Finished, GenerationRequest, TokenLogprob, TopLogprob

if TYPE_CHECKING:
    from .generator import RequestHandle


#: Reported for a log-probability that is not finite (OpenAI's value for an
#: impossible token); NaN and -Infinity are not JSON.
LOGPROB_FLOOR = -9999.0


def finite_logprob(value: float) -> float:
    """``value``, or :data:`LOGPROB_FLOOR` when it is -inf or NaN (a zero
    probability, or float32 logits overflowed by extreme penalties or biases)."""
    return value if math.isfinite(value) else LOGPROB_FLOOR


def token_logprob(tokenizer: Any, token: int, logprobs: Any, top_k: int) -> TokenLogprob:
    """Log-probability of ``token`` and, if ``top_k > 0``, the top-k candidates.

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper`` (for raw vocab pieces).
        token (int): the generated token id.
        logprobs (mx.array): shape ``(vocab,)``, float, log-softmax of the logits
            after logits processors and before the sampler (mlx-lm ``generate_step``).
        top_k (int): how many candidates to report; ``0`` for none.

    Returns:
        TokenLogprob: with ``top`` sorted by descending log-probability; a
        non-finite value is reported as :data:`LOGPROB_FLOOR`.
    """
    import mlx.core as mx

    top: tuple[TopLogprob, ...] = ()
    if top_k > 0:
        ids = mx.argpartition(-logprobs, kth=top_k - 1)[:top_k]
        values = logprobs[ids]
        order = mx.argsort(-values)
        ids_l, vals_l = ids[order].tolist(), values[order].tolist()
        pieces = tokenizer.convert_ids_to_tokens(ids_l)
        top = tuple(
            TopLogprob(i, p, finite_logprob(v))
            for i, p, v in zip(ids_l, pieces, vals_l, strict=True)
        )
    return TokenLogprob(token, finite_logprob(logprobs[token].item()), top)


class Row:
    """The output side of one running request.

    Args:
        handle (RequestHandle): where events go.
        tokenizer: an mlx-lm ``TokenizerWrapper``.
        eos (set[int]): end-of-sequence token ids.
        lane (str): ``"serial"`` or ``"batched"``, reported in ``Finished``.
    """

    def __init__(
        self, handle: RequestHandle, tokenizer: Any, eos: set[int], lane: str = "serial"
    ) -> None:
        self.handle = handle
        self.lane = lane
        self.request: GenerationRequest = handle.request
        self._tokenizer = tokenizer
        self._eos = eos
        self._detok = tokenizer.detokenizer
        self._stops = StopMatcher(self.request.stop)
        self._want_logprobs = self.request.logprobs or self.request.top_logprobs > 0
        self.count = 0
        self.done = False

    def push(self, token: int, logprobs: Any) -> bool:
        """Consume one generated token.

        Args:
            token (int): the sampled token id.
            logprobs (mx.array): shape ``(vocab,)``, the step's log-probabilities.

        Returns:
            bool: True when the request ended here (EOS or a stop string); the
            ``Finished`` event has then been emitted.
        """
        self.count += 1
        lps = ()
        if self._want_logprobs:
            lps = (token_logprob(self._tokenizer, token, logprobs, self.request.top_logprobs),)
        if token in self._eos:
            if lps:
                self.handle.emit(Delta("", (token,), lps))
            self._finish("stop", flush=True)
            return True
        self._detok.add_token(token)
        text = self._stops.feed(self._detok.last_segment)
        if text or lps:
            self.handle.emit(Delta(text, (token,), lps))
        if self._stops.stopped:
            self._finish("stop", flush=False)
            return True
        return False

    def finish_length(self) -> None:
        """End the request because its token budget is spent."""
        self._finish("length", flush=True)

    def _finish(self, reason: str, *, flush: bool) -> None:
        if self.done:
            return
        self.done = True
        if flush:
            self._detok.finalize()
            tail = self._stops.feed(self._detok.last_segment) + self._stops.flush()
            if tail:
                self.handle.emit(Delta(tail))
            if self._stops.stopped:
                reason = "stop"
        prompt = len(self.request.prompt)
        finished = Finished(
            reason,  # type: ignore[arg-type]
            prompt,
            self.count,
            lane=self.lane,
            stop_sequence=self._stops.matched,
        )
        self.handle.emit(finished)

"""The longest prompt text a context window can hold, checked before tokenizing."""

from __future__ import annotations

from typing import Any

from mlxspec.engine.types import ContextLengthError

__all__ = ["TextBound"]


class TextBound:
    """The longest text a context window of tokens can hold, checked before a
    prompt is tokenized (16 MiB of text took a CPU core 24 s to encode, only to be
    refused for its length).

    No token decodes to more characters than its vocabulary entry is long
    (byte-level BPE spells one byte per character, SentencePiece one character
    per character or six for a ``<0xNN>`` byte), so a text longer than
    ``window`` times the longest entry cannot fit; the bound is 4x that, room
    for a normalizer that shrinks text (Unicode composition).

    Args:
        tokenizer: the served tokenizer (``get_vocab()``; without one nothing is bounded).
        window (int): the context limit, tokens.
        words (str | None): the error's opening sentence naming that limit
            (``Admission.context_words``). Default: the model's maximum context length.
    """

    SLACK = 4

    def __init__(self, tokenizer: Any, window: int, words: str | None = None) -> None:
        vocab = getattr(tokenizer, "get_vocab", None)
        longest = max((len(t) for t in vocab()), default=1) if callable(vocab) else None
        self.max_chars = None if longest is None else window * max(longest, 1) * self.SLACK
        self.words = words or f"This model's maximum context length is {window} tokens"

    def check(self, text: str, param: str) -> None:
        """Raises:
        ContextLengthError: ``text`` is longer than :attr:`max_chars`."""
        if self.max_chars is not None and len(text) > self.max_chars:
            raise ContextLengthError(
                f"{self.words}, but the prompt is {len(text)} characters long, more than "
                f"that many tokens can hold (at most {self.max_chars} characters).",
                param=param,
            )

"""The character bound checked before a prompt is tokenized."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxspec.engine.text_bound import TextBound
from mlxspec.engine.types import ContextLengthError


class Vocab:
    def __init__(self, *entries: str) -> None:
        self.entries = entries

    def get_vocab(self) -> dict[str, int]:
        return {e: i for i, e in enumerate(self.entries)}


def test_the_bound_is_window_times_the_longest_entry_times_the_slack() -> None:
    bound = TextBound(Vocab("a", "Ġhello", "<0x0A>"), 10)
    assert bound.max_chars == 10 * 6 * TextBound.SLACK
    bound.check("x" * bound.max_chars, "prompt")  # at the bound: let through
    with pytest.raises(ContextLengthError) as caught:
        bound.check("x" * (bound.max_chars + 1), "prompt")
    assert caught.value.param == "prompt"
    assert str(caught.value) == (
        "This model's maximum context length is 10 tokens, but the prompt is 241 "
        "characters long, more than that many tokens can hold (at most 240 characters)."
    )


def test_the_operators_limit_words_and_no_vocabulary() -> None:
    words = "This server's context limit is 4 tokens"
    bound = TextBound(Vocab("ab"), 4, words)
    with pytest.raises(ContextLengthError, match="^This server's context limit is 4 tokens, but"):
        bound.check("x" * 33, "messages")
    TextBound(object(), 4).check("x" * 10_000, "prompt")  # nothing to bound by


def test_no_real_tokenization_beats_the_bound(tmp_path: Path) -> None:
    """A byte-level BPE (the tiny fixture's: the embedded model's family): on
    dense and sparse texts alike no token spells more characters than the
    longest vocabulary entry, the bound's premise."""
    from transformers import PreTrainedTokenizerFast

    from fixtures.tiny_model import write_tokenizer

    write_tokenizer(tmp_path)
    tok = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    longest = max(len(t) for t in tok.get_vocab())
    for text in ("\n" * 5000, " " * 5000, "hello world " * 500, "日本語のテキスト" * 300):
        tokens = len(tok.encode(text, add_special_tokens=False))
        assert len(text) / tokens <= longest, text[:20]
    assert TextBound(tok, 64).max_chars == 64 * longest * TextBound.SLACK

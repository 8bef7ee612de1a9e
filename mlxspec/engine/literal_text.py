"""Client text is text: special-token strings in it never become control tokens.

A chat template writes its own markup (``<|im_start|>``, ``<|eot_id|>``,
``<end_of_turn>``) around text the client sent. Tokenizing the rendered
prompt in one piece would also read a ``<|im_end|>`` the client typed as the
control token, so a message could close its own turn and open a forged one
(OpenAI's API treats such strings in messages as ordinary text).

:class:`LiteralText` keeps the two apart without changing anything else:
before rendering, each special-token string inside a client string (message
content, tool-call arguments, tool results, tool definitions) is swapped for
a sentinel of plain ASCII that no template filter changes; the template
renders as usual (trimming, ``tojson`` and all); the rendered text is then cut
at the sentinels. The pieces between them are tokenized as before (the
template's markup stays special) and each sentinel's special string is
tokenized as text, through a copy of the tokenizer that does not match special
tokens (``tokenizers``' ``encode_special_tokens``, the switch behind
transformers' ``split_special_tokens``; a copy, because flipping the switch on
the shared tokenizer would race the engine thread's decoding and other prompt
threads). A tokenizer matches special tokens before it pre-tokenizes, so it
already cuts the text where they stand: a prompt with no such string in
client text gives exactly the token ids it gave before.
"""

from __future__ import annotations

import re
import secrets
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["LiteralText", "Protected", "literal_text"]


def _special_strings(tokenizer: Any) -> list[str]:
    """The special tokens' strings of ``tokenizer`` (those its encoder matches
    as control tokens), longest first."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    decoder = getattr(backend, "get_added_tokens_decoder", None)
    if callable(decoder):
        found = {t.content for t in decoder().values() if getattr(t, "special", False)}
    else:
        found = set(getattr(tokenizer, "all_special_tokens", None) or ())
    return sorted((s for s in found if s), key=lambda s: (-len(s), s))


@dataclass(frozen=True)
class Protected:
    """Client values with their special-token strings swapped for sentinels.

    Args:
        value: the values (same shape as given).
        specials (tuple[str, ...]): the special string each sentinel stands
            for, by its number.
        nonce (str): the digits that mark this render's sentinels.
    """

    value: Any
    specials: tuple[str, ...]
    nonce: str


class LiteralText:
    """Tokenizes a rendered prompt with client text as text (module docstring).

    Args:
        tokenizer: an ``mlx_lm`` ``TokenizerWrapper`` or a Hugging Face tokenizer.
    """

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.strings = tuple(_special_strings(tokenizer))
        self.pattern = re.compile("|".join(map(re.escape, self.strings))) if self.strings else None
        self._plain: Any = None
        self._lock = threading.Lock()

    def protect(self, value: Any) -> Protected:
        """``value`` (JSON values: dicts, lists, strings, ...) with every
        special-token string inside its strings (dict keys too) replaced by a
        sentinel.

        Args:
            value: e.g. the normalized messages, or the tool definitions.

        Returns:
            Protected: the new values (``value`` is not mutated) and what each
            sentinel stands for; :attr:`Protected.specials` is empty, and
            :attr:`Protected.value` is ``value`` itself, when there was none.
        """
        if self.pattern is None or not _any_string(value, self._has_special):
            return Protected(value, (), "")
        nonce = _nonce(value)
        specials: list[str] = []

        def swap(match: re.Match[str]) -> str:
            specials.append(match.group(0))
            return f"@{nonce}#{len(specials) - 1}@"

        assert self.pattern is not None
        pattern = self.pattern
        out = _map_strings(value, lambda s: pattern.sub(swap, s) if self._has_special(s) else s)
        return Protected(out, tuple(specials), nonce)

    def _has_special(self, text: str) -> bool:
        # str's substring search is many times faster than the regex's scan
        return any(special in text for special in self.strings)

    def encode(self, text: str, protected: Sequence[Protected]) -> list[int]:
        """Token ids of a rendered prompt: the text between sentinels as
        ``tokenizer.encode(text, add_special_tokens=False)`` reads it, each
        sentinel's special string as plain text.

        Args:
            text (str): the template's output for the protected values.
            protected (Sequence[Protected]): what :meth:`protect` returned for
                the values the template rendered.

        Returns:
            list[int]: token ids (no BOS added).
        """
        marks = {p.nonce: p.specials for p in protected if p.specials}
        if not marks:
            return list(self.tokenizer.encode(text, add_special_tokens=False))
        sentinel = re.compile("@(" + "|".join(marks) + r")#(\d+)@")
        ids: list[int] = []
        at = 0
        for match in sentinel.finditer(text):
            specials = marks[match.group(1)]
            k = int(match.group(2))
            if k >= len(specials):  # digits the template wrote around a sentinel
                continue
            ids += self._markup(text[at : match.start()])
            ids += self.plain_ids(specials[k])
            at = match.end()
        return ids + self._markup(text[at:])

    def restore(self, text: str, protected: Sequence[Protected]) -> str:
        """``text`` with each sentinel replaced by the string it stands for
        (what the template would have rendered from the client's values)."""
        for p in protected:
            if p.specials:
                sentinel = re.compile("@" + p.nonce + r"#(\d+)@")
                specials = p.specials

                def spelt(match: re.Match[str], specials: tuple[str, ...] = specials) -> str:
                    k = int(match.group(1))
                    return specials[k] if k < len(specials) else match.group(0)

                text = sentinel.sub(spelt, text)
        return text

    def _markup(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []

    def plain_ids(self, text: str) -> list[int]:
        """Token ids of ``text`` with no special token matched (its special
        strings spelt out in ordinary tokens).

        Args:
            text (str): client text.

        Returns:
            list[int]: token ids (no BOS added).
        """
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:  # a Python tokenizer: the switch is a per-call argument
            ids = self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
            return list(ids)
        with self._lock:
            if self._plain is None:
                from tokenizers import Tokenizer

                plain = Tokenizer.from_str(backend.to_str())
                plain.encode_special_tokens = True
                self._plain = plain
        return list(self._plain.encode(text, add_special_tokens=False).ids)


_CACHE: weakref.WeakKeyDictionary[Any, LiteralText] = weakref.WeakKeyDictionary()
_CACHE_LOCK = threading.Lock()


def literal_text(tokenizer: Any) -> LiteralText:
    """The :class:`LiteralText` of ``tokenizer``, built once per tokenizer."""
    with _CACHE_LOCK:
        found = _CACHE.get(tokenizer)
        if found is None:
            found = _CACHE[tokenizer] = LiteralText(tokenizer)
        return found


def _map_strings(value: Any, fn: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {_map_strings(k, fn): _map_strings(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_map_strings(v, fn) for v in value]
    return value


def _any_string(value: Any, test: Callable[[str], Any]) -> bool:
    if isinstance(value, str):
        return bool(test(value))
    if isinstance(value, dict):
        return any(_any_string(k, test) or _any_string(v, test) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(_any_string(v, test) for v in value)
    return False


def _nonce(value: Any) -> str:
    """Sixteen random digits that appear in none of ``value``'s strings."""
    while True:
        nonce = "".join(str(secrets.randbelow(10)) for _ in range(16))

        def holds(text: str, nonce: str = nonce) -> bool:
            return nonce in text

        if not _any_string(value, holds):
            return nonce

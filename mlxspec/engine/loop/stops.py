"""Stop-string matching on decoded text, and the logprobs that go with it.

Stops are matched on text, not token ids, so a stop string that spans token
boundaries still fires (the reference's rule; mlx-lm's server matches token
sequences instead). Text that could be the start of a stop string is held
back until disambiguated, so no part of a stop string is ever emitted.
:class:`HeldLogprobs` holds each token's logprob entry back with its text, so
the entries sent with some text are those of the tokens that text came from.
"""

from __future__ import annotations

import codecs
from collections import deque
from collections.abc import Sequence
from dataclasses import replace

from mlxspec.engine.types import TokenLogprob


class StopMatcher:
    """Incremental stop-string matcher.

    Feed decoded text pieces in order; each call returns the text that is now
    safe to emit. Once a stop string is found, ``stopped`` is true, ``matched``
    is that stop string and the output ends just before the earliest match.

    Args:
        stops (Sequence[str]): stop strings; empty strings are ignored.

    Example:
        >>> m = StopMatcher(["\\n\\n"])
        >>> m.feed("Hi\\n"), m.feed("\\nthere"), m.stopped, m.matched
        ('Hi', '', True, '\\n\\n')
    """

    def __init__(self, stops: Sequence[str]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._held = ""
        self.stopped = False
        #: The stop string that ended the output (Anthropic's ``stop_sequence``).
        self.matched: str | None = None

    def feed(self, text: str) -> str:
        """Add ``text`` and return what can be emitted now.

        Returns:
            str: text up to the earliest stop match, or up to the longest
            suffix that is still a prefix of some stop string. ``""`` after a stop.
        """
        if self.stopped:
            return ""
        if not self._stops:
            return text
        buf = self._held + text
        cut = self._earliest_match(buf)
        start = len(buf) - self._partial_suffix_len(buf)
        # A longer stop that starts before ``cut`` may still complete: wait for it.
        if cut >= 0 and cut <= start:
            self._stop_at(buf, cut)
            self._held = ""
            return buf[:cut]
        self._held = buf[start:]
        return buf[:start]

    def flush(self) -> str:
        """Return the held-back text at the end of generation, cut at a stop
        it already contains (one a longer candidate was being waited for)."""
        held, self._held = self._held, ""
        if self.stopped:
            return ""
        cut = self._earliest_match(held)
        if cut >= 0:
            self._stop_at(held, cut)
            return held[:cut]
        return held

    def _stop_at(self, buf: str, cut: int) -> None:
        """Record the stop at ``buf[cut:]``: the longest one when several start
        there (the one a longer candidate was waited for)."""
        self.stopped = True
        self.matched = max((s for s in self._stops if buf.startswith(s, cut)), key=len)

    def _earliest_match(self, buf: str) -> int:
        """Index of the earliest occurrence of any stop in ``buf``, or -1."""
        return min((i for i in (buf.find(s) for s in self._stops) if i >= 0), default=-1)

    def _partial_suffix_len(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a stop."""
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(buf)), best, -1):
                if buf.endswith(stop[:n]):
                    best = n
                    break
        return best


class HeldLogprobs:
    """Pairs tokens' logprob entries with the emitted text their tokens wrote.

    The rule: a token's entry goes out with the first emitted text that holds
    part of the token's own text. When a stop string ends the output, a token
    whose text lies wholly at or after the stop's start gets ``in_stop=True``
    (counted, and in mlx-lm's block, but not the content's); one that straddles
    the boundary, part of its text in the content, is the content's.

    Positions are characters of the detokenized text. The detokenizer may hold a
    token's text back (a partial UTF-8 character, a lone space) and release it
    with a later token's; such a group's text is shared out from its end by
    each token's own length (its bytes, decoded in order), the first token
    taking what is left (a leading space the detokenizer dropped). A token
    with no whole character of its own (part of a multi-byte one) sits with the
    character it helps write.

    Example:
        Stop ``"lh"`` after tokens ``hell``, ``hell``: the content is ``hel``,
        the first token's entry is the content's, the second's is ``in_stop``.
    """

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        #: Tokens the detokenizer has not released text for: (own length, entry).
        self._group: list[tuple[int, TokenLogprob]] = []
        #: Tokens with a position, waiting for their text to be emitted: (start, entry).
        self._placed: deque[tuple[int, TokenLogprob]] = deque()
        self._decoded = 0  # characters the detokenizer has released
        self._emitted = 0  # characters the stop matcher has let out

    def push(
        self, entry: TokenLogprob | None, segment: str, emitted: str, *, stopped: bool, end: bool
    ) -> tuple[TokenLogprob, ...]:
        """Record one step and return the entries to send with ``emitted``.

        Args:
            entry (TokenLogprob | None): the step's token, ``None`` for the
                final flush of the detokenizer.
            segment (str): the text the detokenizer released at this step.
            emitted (str): the text the stop matcher let out at this step.
            stopped (bool): a stop string ended the output here.
            end (bool): the output ends here (every entry goes out).

        Returns:
            tuple[TokenLogprob, ...]: in generation order; after a stop, or at
            the end, every remaining entry, those past the stop marked ``in_stop``.
        """
        if entry is not None:
            own = len(self._decoder.decode(entry.token_bytes))
            self._group.append((own, entry))
        if segment:
            self._place(len(segment))
        self._emitted += len(emitted)
        out = []
        while self._placed and self._placed[0][0] < self._emitted:
            out.append(self._placed.popleft()[1])
        if stopped or end:
            rest = [e for _, e in self._placed] + [e for _, e in self._group]
            out += [replace(e, in_stop=True) for e in rest] if stopped else rest
            self._placed.clear()
            self._group.clear()
        return tuple(out)

    def _place(self, released: int) -> None:
        """Give the held group positions in the ``released`` new characters."""
        start = end = self._decoded + released
        placed = []
        for own, entry in reversed(self._group):
            start = max(self._decoded, start - own)
            placed.append((start, entry))
        self._placed.extend(reversed(placed))
        self._group.clear()
        self._decoded = end

"""Stop-string matching on decoded text.

Stops are matched on text, not token ids, so a stop string that spans token
boundaries still fires (the reference's rule; mlx-lm's server matches token
sequences instead). Text that could be the start of a stop string is held
back until disambiguated, so no part of a stop string is ever emitted.
"""

from __future__ import annotations

from collections.abc import Sequence


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

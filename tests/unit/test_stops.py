"""Stop-string matcher: unit cases and a chunking property (hypothesis)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from mlxspec.engine.loop.stops import HeldLogprobs, StopMatcher
from mlxspec.engine.types import TokenLogprob


def run(stops: list[str], pieces: list[str]) -> tuple[list[str], bool]:
    m = StopMatcher(stops)
    out = [m.feed(p) for p in pieces]
    out.append(m.flush())
    return out, m.stopped


def matched(stops: list[str], pieces: list[str]) -> str | None:
    m = StopMatcher(stops)
    for piece in pieces:
        m.feed(piece)
    m.flush()
    return m.matched


def reference(stops: list[str], text: str) -> tuple[str, bool]:
    """Non-streamed result: cut at the earliest occurrence of any stop."""
    hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)


def test_stop_spanning_pieces_is_never_emitted() -> None:
    out, stopped = run(["\n\n"], ["Hello", "\n", "\nWorld"])
    assert out == ["Hello", "", "", ""]
    assert stopped


def test_partial_prefix_is_released_when_disambiguated() -> None:
    out, stopped = run(["END"], ["a E", "N", "x tail"])
    assert out == ["a ", "", "ENx tail", ""]
    assert not stopped


def test_earliest_of_several_stops_wins() -> None:
    out, stopped = run(["bb", "a"], ["xxbba"])
    assert "".join(out) == "xx"
    assert stopped


def test_held_text_flushed_at_end() -> None:
    out, stopped = run(["###"], ["abc#", "#"])
    assert out == ["abc", "", "##"]
    assert not stopped


def test_no_stops_passes_text_through() -> None:
    assert run([], ["a", "b"]) == (["a", "b", ""], False)
    assert run([""], ["a"]) == (["a", ""], False)


def test_matched_names_the_stop_that_fired() -> None:
    assert matched(["bb", "a"], ["xxbba"]) == "bb"
    assert matched(["END", "\n\n"], ["Hi\n", "\nthere"]) == "\n\n"
    assert matched(["ab", "abc"], ["xabc"]) == "abc"  # both start there: the longer
    assert matched(["ab", "abc"], ["xab", "c"]) == "ab"
    assert matched(["###"], ["abc#", "##"]) == "###"  # found by flush
    assert matched(["###"], ["abc#", "#"]) is None
    assert matched([], ["a"]) is None


def test_nothing_after_stop() -> None:
    m = StopMatcher(["x"])
    assert m.feed("ax") == "a"
    assert m.feed("more") == ""
    assert m.flush() == ""


alphabet = st.sampled_from("ab\n#é😀")


@settings(max_examples=300, deadline=None)
@given(
    text=st.text(alphabet=alphabet, max_size=40),
    stops=st.lists(st.text(alphabet=alphabet, min_size=1, max_size=4), max_size=3),
    cuts=st.lists(st.integers(min_value=0, max_value=40), max_size=10),
)
def test_any_chunking_equals_non_streamed(text: str, stops: list[str], cuts: list[int]) -> None:
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    out, stopped = run(stops, pieces)
    expected, expect_stop = reference(stops, text)
    assert "".join(out) == expected
    assert stopped == expect_stop
    # The reported stop occurs right where the output was cut.
    found = matched(stops, pieces)
    assert (found is not None) == expect_stop
    assert found is None or text.startswith(found, len(expected))
    # No emitted prefix ever contains a stop string.
    emitted = ""
    for piece in out:
        emitted += piece
        assert not any(s in emitted for s in stops)


# --- HeldLogprobs: each token's entry goes out with the text it wrote ----------


def run_held(stops: list[str], steps: list[tuple[bytes, str]]) -> list[tuple[str, list]]:
    """Feed ``(token bytes, detokenizer segment)`` steps through a StopMatcher
    and HeldLogprobs as a Row does; return each step's (emitted text, entries)
    as ``(bytes, in_stop)`` pairs, the end-of-output flush last."""
    matcher, held, out = StopMatcher(stops), HeldLogprobs(), []
    for i, (raw, segment) in enumerate(steps):
        text = matcher.feed(segment)
        entry = TokenLogprob(i, -1.0, token_bytes=raw)
        lps = held.push(entry, segment, text, stopped=matcher.stopped, end=False)
        out.append((text, [(e.token_bytes, e.in_stop) for e in lps]))
        if matcher.stopped:
            return out
    tail = matcher.flush()
    lps = held.push(None, "", tail, stopped=matcher.stopped, end=True)
    return [*out, (tail, [(e.token_bytes, e.in_stop) for e in lps])]


def test_a_token_straddling_the_stop_is_the_contents_the_next_is_the_stops() -> None:
    steps = [(b"hell", "hell"), (b"hell", "hell")]
    assert run_held(["lh"], steps) == [("hel", [(b"hell", False)]), ("", [(b"hell", True)])]
    assert run_held(["hell"], steps[:1]) == [("", [(b"hell", True)])]


def test_entries_wait_with_held_back_text() -> None:
    steps = [(b"ab", "ab"), (b"c", "c"), (b"d", "d")]
    # "abc" could start "abcx": held, with its tokens' entries, until "d" rules it out
    assert run_held(["abcx"], steps) == [
        ("", []),
        ("", []),
        ("abcd", [(b"ab", False), (b"c", False), (b"d", False)]),
        ("", []),
    ]
    # the end of output lets the held text and its entries out
    assert run_held(["abcx"], steps[:2]) == [
        ("", []),
        ("", []),
        ("abc", [(b"ab", False), (b"c", False)]),
    ]


def test_text_the_detokenizer_releases_late_is_shared_by_its_tokens() -> None:
    # a lone space is held by the BPE detokenizer and released with the next token
    steps = [(b"a", "a"), (b" ", ""), (b"\n\n", " \n\n")]
    assert run_held(["\n\n"], steps) == [
        ("a", [(b"a", False)]),
        ("", []),
        (" ", [(b" ", False), (b"\n\n", True)]),
    ]
    # a 2-byte character in two tokens is in the content, or in the stop, whole
    utf8 = [(b"\xc3", ""), (b"\xa9", "\u00e9"), (b"!", "!")]
    assert run_held(["!"], utf8)[-1] == ("", [(b"!", True)])
    assert run_held(["!"], utf8)[1] == ("\u00e9", [(b"\xc3", False), (b"\xa9", False)])
    assert run_held(["\u00e9"], utf8) == [("", []), ("", [(b"\xc3", True), (b"\xa9", True)])]
    # the detokenizer's dropped leading space: the first token keeps what is left
    assert run_held(["i"], [(b" Hi", "Hi")]) == [("H", [(b" Hi", False)])]
    assert run_held(["H"], [(b" Hi", "Hi")]) == [("", [(b" Hi", True)])]


# --- stop strings: a short stop inside a longer, earlier one -----------------
# (found by the chunking property above while running the suite)


def test_longer_stop_starting_earlier_wins_when_streamed() -> None:
    from mlxspec.engine.loop.stops import StopMatcher

    m = StopMatcher(["b", "aba"])
    assert (m.feed("ab"), m.feed("a"), m.stopped) == ("", "", True)
    m = StopMatcher(["b", "aba"])
    assert (m.feed("ab"), m.flush(), m.stopped) == ("", "a", True)
    m = StopMatcher(["b", "aba"])
    assert (m.feed("ab"), m.feed("c"), m.stopped) == ("", "a", True)

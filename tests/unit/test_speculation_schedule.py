"""The per-row draft schedule (``SpecCounts.adapt``) and prompt lookup
(``NgramDrafts.propose``): pure functions, no model."""

from __future__ import annotations

from mlxspec.engine.speculative import NgramDrafts, SpecCounts


def test_lookahead_grows_after_kept_drafts_and_shrinks_after_misses() -> None:
    spec = SpecCounts()
    spec.adapt(drafted=4, kept=4, most=6)
    assert (spec.lookahead, spec.pause) == (6, 0)
    spec.adapt(drafted=6, kept=6, most=6)
    assert spec.lookahead == 6  # capped at --num-draft-tokens
    spec.adapt(drafted=6, kept=2, most=6)
    assert (spec.lookahead, spec.pause) == (5, 0)


def test_drafts_that_keep_missing_pause_drafting_longer_each_time() -> None:
    spec = SpecCounts(lookahead=3)
    pauses = []
    for _ in range(6):
        spec.adapt(drafted=1, kept=0, most=4)
        pauses.append(spec.pause)
    assert pauses == [1, 3, 7, 15, 15, 15]
    assert spec.lookahead == 1
    spec.adapt(drafted=1, kept=1, most=4)  # one kept draft resets the pause
    assert (spec.pause, spec.misses, spec.lookahead) == (0, 0, 3)


def test_prompt_lookup_copies_after_the_latest_match() -> None:
    drafts = NgramDrafts()
    seq = [1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 5, 1, 2, 3]
    assert drafts.propose(seq, 3) == [7, 8, 5]  # the latest [1, 2, 3] before the end
    assert drafts.propose(seq, 1) == [7]
    assert drafts.propose([4, 5, 6, 7], 3) == []  # no earlier bigram
    assert drafts.propose([4, 5, 4, 6], 3) == []  # a lone token matching is not enough
    assert drafts.propose(seq, 0) == []


def test_finding_no_draft_rests_the_row_too() -> None:
    spec = SpecCounts()
    spec.found_none()
    spec.found_none()
    assert (spec.misses, spec.pause) == (2, 3)

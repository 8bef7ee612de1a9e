"""The prompt cache's trie search (``engine/caches/token_trie.py``) against
mlx-lm's ``PromptTrie.search`` on random tries: the same exact, shorter and
common-prefix answers, and a longer entry that is stored and extends the
common prefix; and its cost does not grow with the entries below the point
where the prompt leaves the trie."""

from __future__ import annotations

import random

import pytest
from mlx_lm.models.cache import PromptTrie

from mlxspec.engine.caches.token_trie import TokenTrie


def _tries(seed: int) -> tuple[PromptTrie, TokenTrie, list[list[int]]]:
    rng = random.Random(seed)
    theirs, ours, stored = PromptTrie(), TokenTrie(), []
    head = [rng.randrange(8) for _ in range(rng.randrange(0, 6))]
    for i in range(rng.randrange(1, 30)):
        seq = head + [rng.randrange(4) for _ in range(rng.randrange(0, 12))]
        theirs.add("m", seq, i)
        ours.add("m", seq, i)
        stored.append(seq)
    for seq in rng.sample(stored, k=len(stored) // 3):  # some removed: pruned branches
        if tuple(seq) in {tuple(s) for s in stored}:
            try:
                theirs.pop("m", seq)
                ours.pop("m", seq)
            except KeyError:  # popped already (a duplicate)
                continue
            stored = [s for s in stored if s != seq]
    return theirs, ours, stored


@pytest.mark.parametrize("seed", range(60))
def test_search_agrees_with_mlx_lm(seed: int) -> None:
    theirs, ours, stored = _tries(seed)
    rng = random.Random(1000 + seed)
    live = {tuple(s) for s in stored}
    queries = [rng.choice(stored)[: rng.randrange(0, 14)] + [rng.randrange(4) for _ in range(3)]
               for _ in range(20)] + [list(s) for s in stored] + [[], [7, 7, 7]]  # fmt: skip
    for q in queries:
        want, got = theirs.search("m", q), ours.search("m", q)
        assert (got.exact, got.shorter, got.common_prefix) == (
            want.exact, want.shorter, want.common_prefix), q  # fmt: skip
        assert (got.longer is None) == (want.longer is None), q
        if got.longer is not None:
            assert tuple(got.longer) in live  # a stored entry...
            assert got.longer[: got.common_prefix] == q[: got.common_prefix]  # ...extending it
            assert ours.get("m", got.longer) is not None
    assert ours.search("other", [1, 2]).common_prefix == 0


class Untouchable(dict):
    """A subtree a linear search must never enter: any read raises."""

    def _refuse(self, *_: object) -> None:
        raise AssertionError("the search entered another entry's branch")

    __getitem__ = __contains__ = __iter__ = get = keys = items = _refuse  # type: ignore[assignment]


def test_a_lookup_follows_one_path_below_where_the_prompt_leaves() -> None:
    """64 entries that share a 30-token head and then differ (chat prompts): below
    the head, every branch but the first is made unreadable. mlx-lm's search walks
    them all (depth first, copying the path at each node: 63 ms with 64 entries of
    286 tokens, 299 ms with 256, on the development CPU); ours reads one path."""
    rng = random.Random(0)
    head = list(range(30))
    entries = [head + [50_000 + 300 * i + j for j in range(256)] for i in range(64)]
    tries = (PromptTrie(), TokenTrie())
    for trie in tries:
        for i, seq in enumerate(entries):
            trie.add("m", seq, i)
        node = trie._trie["m"]
        for token in head:
            node = node[token]
        first, *others = list(node)
        for token in others:
            node[token] = Untouchable(node[token])
    prompt = head + [rng.randrange(50_000) for _ in range(200)]
    found = tries[1].search("m", prompt)
    assert found.common_prefix == 30 and found.longer == entries[0] and found.shorter is None
    with pytest.raises(AssertionError, match="another entry's branch"):
        tries[0].search("m", prompt)

"""Which waiting rows prefill together (``loop/prefill.py`` ``take_group``):
the first row and those after it needing as many chunks, within the chunk's
token budget and the free rows, in arrival order; the rest keep their order."""

from __future__ import annotations

from collections import deque

from mlxspec.engine.loop.prefill import Slot, take_group


def _slots(*prompt_lengths: int) -> deque[Slot]:
    # the row and sampler are never read by take_group
    return deque(
        Slot(row=None, seq=list(range(n)), budget=1, sampling=None) for n in prompt_lengths
    )  # type: ignore[arg-type]


def test_rows_needing_as_many_chunks_go_together() -> None:
    waiting = _slots(100, 30, 700, 120, 1)  # to prefill: 99, 29, 699, 119, 0 at step 128
    group = take_group(waiting, rows=8, step=128, tokens=1024)
    assert [len(s.seq) for s in group] == [100, 30, 120]  # one chunk each
    assert [len(s.seq) for s in waiting] == [700, 1]


def test_the_token_budget_and_free_rows_bound_a_group() -> None:
    waiting = _slots(*([200] * 6))  # two chunks each; the first is 128 tokens
    assert len(take_group(waiting, rows=8, step=128, tokens=300)) == 2
    assert len(take_group(waiting, rows=1, step=128, tokens=4096)) == 1
    assert len(waiting) == 3


def test_the_first_row_always_goes_even_over_the_budget() -> None:
    waiting = _slots(5000, 5000)
    assert len(take_group(waiting, rows=8, step=512, tokens=100)) == 1


def test_rows_with_nothing_to_prefill_group_together() -> None:
    waiting = _slots(1, 1, 9)
    group = take_group(waiting, rows=8, step=4, tokens=32)
    assert [len(s.seq) for s in group] == [1, 1]

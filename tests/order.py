"""The order in which test files reach the xdist workers: the costliest first.

``--dist loadfile`` hands each worker a file at a time, in the queue's order,
and pytest-xdist's default ``--loadscope-reorder`` builds that queue by the
number of tests in a file, most first. That put the files with one or two slow
tests (the real-model speculation and KV agreement, the chat-gap test, the model
pool, the distributed ranks) at the very end, where one worker ran them alone
after the other had run out of work: the CI run of 2026-12-06 ended on
``real/test_speculation.py``'s seven minutes. Longest first (Graham's LPT rule
for scheduling on identical machines) leaves the cheap files to fill the end.

The queue here: the files in :data:`COST`, costliest first; then every other file
with a test that is not ``fast`` (a process, the real model, a browser), in
collection order; then the ``fast`` files (many, each a few seconds). Tests keep
their order within a file. xdist's own reorder is switched off
(:func:`keep_collection_order`) so this order is the one it hands out.
"""

from __future__ import annotations

import pytest

#: Seconds of one file on one CI worker (2 workers, 2 cores), rounded: from the CI
#: run's slowest phases and docs/testing.md's per-file figures, after this branch's
#: cuts. Only the order matters; a file not listed sorts after these.
COST = {
    "tests/api/test_audio_api.py": 500,
    "tests/api/test_model_pool.py": 300,
    "tests/real/test_audio_languages.py": 230,
    "tests/api/test_distributed.py": 180,
    "tests/real/test_speculation.py": 150,
    "tests/api/test_fuzz.py": 120,
    "tests/real/test_parity.py": 100,
    "tests/api/test_audio_priority.py": 90,
    "tests/api/test_audio_convert.py": 80,
    "tests/unit/test_audio_worker.py": 70,
    "tests/unit/test_cli.py": 60,
    "tests/api/test_cache_routes.py": 60,
    "tests/real/test_adapters.py": 55,
    "tests/real/test_kv_quant_real.py": 40,
}


def _file(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def costliest_first(items: list[pytest.Item]) -> None:
    """Reorder ``items`` in place: whole files, by :data:`COST`, then files with a
    test outside ``fast``, then the rest; stable within each group and file.

    Call it after :func:`tests.tiers.classify` (it reads the ``fast`` marker).

    Args:
        items (list[pytest.Item]): the session's collected items, grouped by file
            as pytest collects them.
    """
    heavy = {_file(i) for i in items if i.get_closest_marker("fast") is None}

    def key(item: pytest.Item) -> tuple[int, int]:
        name = _file(item)
        if name in COST:
            return (0, -COST[name])
        return (1, 0) if name in heavy else (2, 0)

    items.sort(key=key)


def keep_collection_order(config: pytest.Config) -> None:
    """Have ``--dist loadfile`` hand out files in collection order (xdist's
    ``--no-loadscope-reorder``), so :func:`costliest_first` decides the queue.
    A no-op without pytest-xdist."""
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False

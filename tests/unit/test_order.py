"""tests/order.py: the files reach the xdist workers costliest first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tests import order


class _Item:
    """What :func:`order.costliest_first` reads of a pytest item."""

    def __init__(self, nodeid: str, fast: bool) -> None:
        self.nodeid = nodeid
        self._fast = fast

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "fast" and self._fast else None


def test_listed_files_first_by_cost_then_heavy_then_fast_whole_files_in_order() -> None:
    items = [
        _Item("tests/unit/test_a.py::test_1", True),
        _Item("tests/unit/test_a.py::test_2", True),
        _Item("tests/api/test_b.py::test_1", True),
        _Item("tests/api/test_b.py::test_2", False),  # one test not fast: b is heavy
        _Item("tests/real/test_kv_quant_real.py::test_1", False),
        _Item("tests/real/test_speculation.py::test_x[ngram]", False),
        _Item("tests/real/test_speculation.py::test_x[model]", False),
        _Item("tests/api/test_audio_api.py::test_1", False),
        _Item("tests/unit/test_c.py::test_1", True),
    ]
    order.costliest_first(items)  # type: ignore[arg-type]
    assert [i.nodeid for i in items] == [
        "tests/api/test_audio_api.py::test_1",
        "tests/real/test_speculation.py::test_x[ngram]",
        "tests/real/test_speculation.py::test_x[model]",
        "tests/real/test_kv_quant_real.py::test_1",
        "tests/api/test_b.py::test_1",
        "tests/api/test_b.py::test_2",
        "tests/unit/test_a.py::test_1",
        "tests/unit/test_a.py::test_2",
        "tests/unit/test_c.py::test_1",
    ]


def test_the_cost_table_names_files_that_exist() -> None:
    from tests.conftest import ROOT

    missing = [name for name in order.COST if not (ROOT / name).is_file()]
    assert missing == []


def test_xdist_reorder_is_switched_off_and_absent_xdist_is_fine() -> None:
    config = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True))
    order.keep_collection_order(config)  # type: ignore[arg-type]
    assert config.option.loadscopereorder is False
    bare = SimpleNamespace(option=SimpleNamespace())
    order.keep_collection_order(bare)  # type: ignore[arg-type]
    assert not hasattr(bare.option, "loadscopereorder")


def test_this_session_runs_with_the_reorder_off(pytestconfig: pytest.Config) -> None:
    if not hasattr(pytestconfig.option, "loadscopereorder"):
        pytest.skip("pytest-xdist is not installed")
    assert pytestconfig.option.loadscopereorder is False

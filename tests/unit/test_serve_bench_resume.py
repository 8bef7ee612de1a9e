"""benchmarks/serve_bench.py: ``--resume`` keeps the levels of a server run cut off
mid-way, so a run longer than one device call finishes over several calls."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))  # serve_bench imports bench_report and direct_baseline
_spec = importlib.util.spec_from_file_location("serve_bench", BENCH / "serve_bench.py")
serve_bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(serve_bench)


def _level(conc: int, tok_per_s: float) -> dict:
    return {"prompt_tokens": 128, "concurrency": conc, "tok_per_s": tok_per_s}


def test_a_cut_off_runs_levels_are_carried_into_its_rerun_and_written_again(tmp_path):
    partial = {
        "done": [{"direct": 150.0}, {"kind": "mlx_lm", "run": {"levels": [_level(1, 90.0)]}}],
        "under_way": {"kind": "mlxspec", "levels": [_level(1, 140.0), _level(8, 700.0)]},
    }
    progress = serve_bench.Progress(tmp_path / "p.json", partial)
    assert progress.carried("mlxspec", 128, 8) == _level(8, 700.0)
    assert progress.carried("mlxspec", 128, 32) is None  # not measured: measure it
    assert progress.carried("mlxspec", 1024, 8) is None  # another prompt length
    assert progress.carried("mlx_lm", 128, 1) is None  # only the cut-off server's run

    progress.level("mlxspec", _level(1, 140.0))  # the rerun takes the kept levels first
    written = json.loads((tmp_path / "p.json").read_text())
    assert written["under_way"] == {"kind": "mlxspec", "levels": [_level(1, 140.0)]}
    assert written["done"] == partial["done"]

    progress.finish({"kind": "mlxspec", "run": {"levels": []}})
    assert progress.carried("mlxspec", 128, 8) is None  # the next repeat measures afresh


def test_a_run_cut_between_servers_carries_nothing(tmp_path):
    progress = serve_bench.Progress(tmp_path / "p.json", {"done": [], "under_way": None})
    assert progress.carried("mlxspec", 128, 1) is None
    assert serve_bench.Progress(tmp_path / "q.json").carried("mlxspec", 128, 1) is None

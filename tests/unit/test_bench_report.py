"""benchmarks/bench_report.py: the single-stream ratio to mlx-lm's
``stream_generate`` against interleaved baselines, on new and old result files."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
_spec = importlib.util.spec_from_file_location("bench_report", BENCH / "bench_report.py")
bench_report = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_report)

# A result saved before the interleaved baselines: one stream_generate figure
# (5.33 tok/s) and two repeats whose mlxspec c=1 runs were 5.10 and 4.08 tok/s.
OLD_RESULT = BENCH / "results" / "cpu-smollm2-solo.json"


def test_each_repeat_is_divided_by_the_mean_of_the_baselines_around_it():
    ratios = bench_report.single_stream_ratios([45.0, 60.0, 150.0], [100.0, 80.0, 40.0, 160.0])
    assert ratios == [0.5, 1.0, 1.5]


def test_one_baseline_divides_every_repeat():
    assert bench_report.single_stream_ratios([50.0, 75.0], [100.0]) == [0.5, 0.75]


def test_baselines_that_do_not_bracket_the_repeats_are_an_error():
    with pytest.raises(ValueError) as info:
        bench_report.single_stream_ratios([50.0, 75.0], [100.0, 90.0])
    assert str(info.value) == (
        "2 stream_generate runs for 2 repeats: expected one more baseline than repeats"
    )


def test_interleaved_result_reports_the_median_of_per_repeat_ratios(capsys):
    report = json.loads(OLD_RESULT.read_text())
    report["mlx_lm_stream_generate_tok_per_s_runs"] = [6.0, 5.0, 4.0]
    report["mlx_lm_stream_generate_tok_per_s"] = 5.0
    bench_report.summarise(report)
    # repeat 1: 5.102 / mean(6, 5) = 0.928; repeat 2: 4.076 / mean(5, 4) = 0.906
    assert report["single_stream_vs_stream_generate_runs"] == pytest.approx(
        [0.927704, 0.905792], abs=1e-6
    )
    assert report["single_stream_vs_stream_generate"] == pytest.approx(0.916748, abs=1e-6)
    # the older key: the median c=1 level (4.076) over the median baseline (5.0)
    assert report["mlxspec_single_stream_over_stream_generate"] == pytest.approx(0.815213, abs=1e-6)
    assert (
        "single stream: mlxspec c=1 / stream_generate x0.92 (median of repeats 0.93, 0.91; "
        "stream_generate tok/s 6.0, 5.0, 4.0)" in capsys.readouterr().out
    )


def test_old_result_file_still_reports(capsys, tmp_path):
    path = tmp_path / OLD_RESULT.name
    path.write_text(OLD_RESULT.read_text())
    assert bench_report.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert (
        "single stream: mlxspec c=1 / stream_generate x0.86 (median of repeats 0.96, 0.77; "
        "stream_generate tok/s one run)" in out
    )
    assert "mlxspec/mlx_lm prompt    64 conc   1: tok/s x0.93, TTFT p50" in out
    assert json.loads(path.read_text()) == json.loads(OLD_RESULT.read_text())  # not rewritten


def test_result_without_a_baseline_gets_no_single_stream_ratio():
    report = json.loads(OLD_RESULT.read_text())
    del report["mlx_lm_stream_generate_tok_per_s"]
    del report["mlxspec_single_stream_over_stream_generate"]  # saved by the old summarise
    bench_report.summarise(report)
    assert "single_stream_vs_stream_generate" not in report
    assert "mlxspec_single_stream_over_stream_generate" not in report


SAVED = sorted(p for p in (BENCH / "results").glob("*.json") if '"servers"' in p.read_text())


@pytest.mark.parametrize("path", SAVED, ids=[p.stem for p in SAVED])
def test_every_saved_serve_bench_result_still_reports(path, capsys):
    report = json.loads(path.read_text())
    bench_report.summarise(report)
    out = capsys.readouterr().out
    for kind in report["servers"]:
        assert f"\n{kind:8} " in "\n" + out  # each server's rows are printed
    if "mlx_lm_stream_generate_tok_per_s" in report and "mlxspec" in report["servers"]:
        assert "single stream: mlxspec c=1 / stream_generate x" in out


def test_mlxspec_is_divided_by_each_mlx_lm_baseline_present(capsys):
    report = json.loads(OLD_RESULT.read_text())
    theirs = json.loads(json.dumps(report["servers"]["mlx_lm"]))
    for lv in theirs["levels"]:  # mlx_lm.server with cuDNN off: twice as fast, half the TTFT
        lv["tok_per_s"] *= 2
        lv["ttft_p50"] /= 2
    report["servers"]["mlx_lm-nocudnn"] = theirs
    bench_report.summarise(report)
    shipped = report["ratios_mlxspec_over_mlx_lm"]
    same_settings = report["ratios_mlxspec_over_mlx_lm-nocudnn"]
    assert [r["concurrency"] for r in same_settings] == [r["concurrency"] for r in shipped]
    for a, b in zip(shipped, same_settings, strict=True):
        assert b["tok_per_s_ratio"] == pytest.approx(a["tok_per_s_ratio"] / 2)
        assert b["ttft_p50_ratio"] == pytest.approx(a["ttft_p50_ratio"] * 2)
    assert "mlxspec/mlx_lm-nocudnn prompt    64 conc   1: tok/s x0.46" in capsys.readouterr().out


def test_the_nocudnn_kind_is_mlx_lm_server_with_cudnn_attention_off():
    import sys

    sys.path.insert(0, str(BENCH))
    try:
        spec = importlib.util.spec_from_file_location("serve_bench", BENCH / "serve_bench.py")
        serve_bench = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(serve_bench)
    finally:
        sys.path.remove(str(BENCH))
    cmd = serve_bench.server_command("mlx_lm-nocudnn", "/m", 8123, 8)
    assert cmd == serve_bench.server_command("mlx_lm", "/m", 8123, 8)
    assert cmd[1:5] == ["-m", "mlx_lm.server", "--model", "/m"]
    assert serve_bench.KIND_ENV["mlx_lm-nocudnn"] == ("mlx_lm", {"MLX_CUDA_USE_CUDNN_SDPA": "0"})
    assert serve_bench.server_command("mlxspec-nocache", "/m", 8123, 8)[-2:] == [
        "--prompt-cache-bytes",
        "0",
    ]
    assert serve_bench.TURNS_ONLY == {"mlxspec-nocache"}


def test_the_decode_only_single_stream_ratio_uses_each_repeats_decode_rate(capsys):
    report = json.loads(OLD_RESULT.read_text())
    report["mlx_lm_stream_generate_tok_per_s_runs"] = [6.0, 5.0, 4.0]
    report["mlx_lm_stream_generate_tok_per_s"] = 5.0
    first = report["servers"]["mlxspec"]["levels"][0]
    assert first["concurrency"] == 1
    first["decode_tok_per_s_runs"] = [5.5, 4.5]  # repeat 1, repeat 2
    bench_report.summarise(report)
    # 5.5 / mean(6, 5) = 1.0; 4.5 / mean(5, 4) = 1.0
    assert report["single_stream_decode_vs_stream_generate_runs"] == [1.0, 1.0]
    assert report["single_stream_decode_vs_stream_generate"] == 1.0
    assert (
        "decode only (first token to last, as generation_tps): x1.00 (median of repeats "
        "1.00, 1.00)" in capsys.readouterr().out
    )


def test_merged_levels_keep_every_runs_decode_rate():
    def run(tps: float, decode: float) -> dict:
        level = {"prompt_tokens": 64, "concurrency": 1, "tok_per_s": tps}
        return {"levels": [{**level, "decode_tok_per_s_p50": decode}], "multi_turn": None}

    merged = bench_report.merge_runs([run(10.0, 12.0), run(8.0, 11.0), run(9.0, 13.0)])
    (level,) = merged["levels"]
    assert level["tok_per_s"] == 9.0  # the median run by aggregate tokens/s
    assert level["decode_tok_per_s_runs"] == [12.0, 11.0, 13.0]


def test_engine_step_times_of_each_run_are_kept_and_printed(capsys):
    report = json.loads(OLD_RESULT.read_text())
    steps = {"steps": 900, "mean_rows": 7.5, "generate_ms_mean": 8.25, "route_ms_mean": 0.5}
    solo = {"steps": 60, "mean_rows": 1.0, "generate_ms_mean": 2.5, "route_ms_mean": 0.25}
    levels = report["servers"]["mlxspec"]["levels"]
    runs = [
        {"levels": levels, "multi_turn": None, "engine_steps": s, "engine_solo_steps": o}
        for s, o in ((steps, solo), (None, None))
    ]
    merged = bench_report.merge_runs(runs)
    assert merged["engine_steps_runs"] == [steps, None]
    assert merged["engine_solo_steps_runs"] == [solo, None]
    report["servers"]["mlxspec"] = merged
    bench_report.summarise(report)
    out = capsys.readouterr().out
    assert "mlxspec  batched steps 900: 7.5 rows, model 8.25 ms + routing 0.50 ms per step" in out
    assert "mlxspec  solo steps 60: 1.0 rows, model 2.50 ms + routing 0.25 ms per step" in out

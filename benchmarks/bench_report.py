"""Reporting for ``serve_bench.py``: merging repeated runs, the printed
summary with mlxspec / mlx_lm ratios and the single-stream ratio to mlx-lm's
``stream_generate``, and the PNG plot. Re-reports a saved result:

    python benchmarks/bench_report.py benchmarks/results/NAME.json [--plot]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


def pct(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (nearest rank), ``None`` when empty."""
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def merge_runs(runs: list[dict]) -> dict:
    """One server's repeated runs -> one result: each level is its median run by
    aggregate tokens/s (the lower middle one for an even count), with every
    run's tokens/s kept in ``tok_per_s_runs`` (and mlxspec's per-level engine reading,
    ``engine``, in ``engine_runs``); the multi-turn result is the first run's;
    each run's engine step times (mlxspec's ``GET /stats`` ``batch.steps`` and
    ``batch.solo_steps``) are kept in ``engine_steps_runs`` and ``engine_solo_steps_runs``."""
    levels = []
    for i, first in enumerate(runs[0]["levels"]):
        same = sorted((r["levels"][i] for r in runs), key=lambda lv: lv["tok_per_s"])
        mid = dict(same[(len(same) - 1) // 2])
        mid["tok_per_s_runs"] = [r["levels"][i]["tok_per_s"] for r in runs]
        if "decode_tok_per_s_p50" in first:
            mid["decode_tok_per_s_runs"] = [r["levels"][i]["decode_tok_per_s_p50"] for r in runs]
        if "engine" in first:  # mlxspec's per-level engine reading, every run's
            mid["engine_runs"] = [r["levels"][i].get("engine") for r in runs]
        assert mid["concurrency"] == first["concurrency"]
        levels.append(mid)
    merged = {"levels": levels, "multi_turn": runs[0]["multi_turn"]}
    for key in ("engine_steps", "engine_solo_steps"):  # mlxspec's GET /stats step times
        if any(r.get(key) for r in runs):
            merged[f"{key}_runs"] = [r.get(key) for r in runs]
    if runs[0].get("fit"):  # mlxspec's GET /fit after its first run
        merged["fit"] = runs[0]["fit"]
    return merged


#: The servers mlxspec's levels are divided by: ``mlx_lm`` (mlx_lm.server as
#: shipped) and ``mlx_lm-nocudnn`` (with ``mlxspec serve``'s cuDNN setting).
BASELINES = ("mlx_lm", "mlx_lm-nocudnn")


def level_ratios(ours: dict, theirs: dict) -> list[dict]:
    """Per level, our aggregate tokens/s and TTFT p50 over another server's.

    Args:
        ours (dict): mlxspec's merged result (:func:`merge_runs`).
        theirs (dict): the other server's; levels are paired by prompt size and
            concurrency, and a level only one of them ran (``--cap``) is left out.

    Returns:
        list[dict]: ``prompt_tokens``, ``concurrency``, ``tok_per_s_ratio`` and
        ``ttft_p50_ratio`` per level.
    """
    other = {(b["prompt_tokens"], b["concurrency"]): b for b in theirs["levels"]}
    return [
        {
            "prompt_tokens": a["prompt_tokens"],
            "concurrency": a["concurrency"],
            "tok_per_s_ratio": a["tok_per_s"] / max(b["tok_per_s"], 1e-9),
            "ttft_p50_ratio": a["ttft_p50"] / max(b["ttft_p50"], 1e-9),
        }
        for a in ours["levels"]
        if (b := other.get((a["prompt_tokens"], a["concurrency"]))) is not None
    ]


def summarise(report: dict) -> None:
    servers = report["servers"]
    for base in BASELINES:  # mlx_lm.server as shipped, and with mlxspec's MLX settings
        if {base, "mlxspec"} <= servers.keys():
            report[f"ratios_mlxspec_over_{base}"] = level_ratios(servers["mlxspec"], servers[base])
    single_stream_summary(report)
    print(
        f"{'server':8} {'prompt':>6} {'conc':>4} {'tok/s':>8} {'TTFT p50':>9} {'p95':>7} "
        f"{'ITL p50':>8} {'p95':>7}"
    )
    for kind, data in servers.items():
        for lv in data["levels"]:
            print(
                f"{kind:8} {lv['prompt_tokens']:6} {lv['concurrency']:4} {lv['tok_per_s']:8.1f} "
                f"{lv['ttft_p50']:9.3f} {lv['ttft_p95']:7.3f} {lv['itl_p50'] or 0:8.4f} "
                f"{lv['itl_p95'] or 0:7.4f} failed={lv['failed']} 429={lv.get('rejected_429', 0)}"
            )
        if data.get("multi_turn"):
            print(f"{kind:8} {multi_turn_line(data['multi_turn'])}")
        for key, what in (("engine_steps_runs", "batched"), ("engine_solo_steps_runs", "solo")):
            for steps in data.get(key) or ():
                if steps and steps["steps"]:
                    print(
                        f"{kind:8} {what} steps {steps['steps']}: {steps['mean_rows']:.1f} rows, "
                        f"model {steps['generate_ms_mean']:.2f} ms + routing "
                        f"{steps['route_ms_mean']:.2f} ms per step"
                    )
    if {"mlxspec", "mlxspec-nocache"} <= servers.keys():
        cached = servers["mlxspec"]["multi_turn"]["turns"]
        fresh = servers["mlxspec-nocache"]["multi_turn"]["turns"]
        per_turn = [a["ttft"] / max(b["ttft"], 1e-9) for a, b in zip(cached, fresh, strict=True)]
        report["prompt_cache_ttft_ratio"] = {
            "per_turn": per_turn,
            "later_turns_p50": pct(per_turn[1:], 0.5),
        }
        print(
            "prompt cache: TTFT with / without the cache per turn "
            + ", ".join(f"{r:.2f}" for r in per_turn)
            + f" (later turns p50 {report['prompt_cache_ttft_ratio']['later_turns_p50']:.2f})"
        )
    for base in BASELINES:
        for r in report.get(f"ratios_mlxspec_over_{base}", []):
            print(
                f"mlxspec/{base} prompt {r['prompt_tokens']:5} conc {r['concurrency']:3}: "
                f"tok/s x{r['tok_per_s_ratio']:.2f}, TTFT p50 x{r['ttft_p50_ratio']:.2f}"
            )
    if "single_stream_vs_stream_generate" in report:
        runs = report["single_stream_vs_stream_generate_runs"]
        direct = report.get("mlx_lm_stream_generate_tok_per_s_runs", [])
        print(
            f"single stream: mlxspec c=1 / stream_generate "
            f"x{report['single_stream_vs_stream_generate']:.2f} (median of repeats "
            + ", ".join(f"{r:.2f}" for r in runs)
            + "; stream_generate tok/s "
            + (", ".join(f"{d:.1f}" for d in direct) or "one run")
            + ")"
        )
    if "single_stream_decode_vs_stream_generate" in report:
        runs = report["single_stream_decode_vs_stream_generate_runs"]
        print(
            "single stream, decode only (first token to last, as generation_tps): "
            f"x{report['single_stream_decode_vs_stream_generate']:.2f} (median of repeats "
            + ", ".join(f"{r:.2f}" for r in runs)
            + ")"
        )


def multi_turn_line(mt: dict) -> str:
    """One line for a server's multi-turn result, in any shape saved so far
    (older files: two turns and no ``turns`` list, or no repeat of the last turn)."""
    if "turns" not in mt:
        return f"two-turn TTFT turn2/turn1 = {mt['ratio']:.2f} (turn1 {mt['turn1_ttft']:.3f}s)"
    cached = [t["cached_tokens"] for t in mt["turns"]]
    line = (
        f"multi-turn TTFT later/turn1 = {mt['ratio']:.2f} (turn1 {mt['turn1_ttft']:.3f}s, "
        f"later p50 {mt['later_ttft_p50']:.3f}s, cached tokens per turn {cached})"
    )
    if "repeat_ratio" in mt:
        line += (
            f"; repeat of the last turn: TTFT x{mt['repeat_ratio']:.2f} "
            f"({mt['repeat']['cached_tokens']} cached)"
        )
    return line


def single_stream_ratios(server_runs: list[float], direct_runs: list[float]) -> list[float]:
    """Each repeat's single-stream tokens/s over the ``stream_generate``
    baselines measured around it.

    ``serve_bench.py`` measures the direct baseline before each repeat and once
    after the last, so repeat ``i`` sits between ``direct_runs[i]`` and
    ``direct_runs[i + 1]`` and is divided by their mean: the baseline moves
    between machine starts (323-559 tok/s on one H200 model), so a ratio is
    only meaningful against a baseline taken beside it. Results saved before
    the interleaving have one baseline, which every repeat is divided by.

    Args:
        server_runs (list[float]): a server's concurrency-1 tokens/s, one per
            repeat, in run order.
        direct_runs (list[float]): ``stream_generate`` tokens/s in run order,
            ``len(server_runs) + 1`` values (or one).

    Returns:
        list[float]: one ratio per repeat.

    Raises:
        ValueError: when the counts do not pair up as above.
    """
    if len(direct_runs) == 1:
        return [s / direct_runs[0] for s in server_runs]
    if len(direct_runs) != len(server_runs) + 1:
        raise ValueError(
            f"{len(direct_runs)} stream_generate runs for {len(server_runs)} repeats: "
            "expected one more baseline than repeats"
        )
    return [s / ((direct_runs[i] + direct_runs[i + 1]) / 2) for i, s in enumerate(server_runs)]


def single_stream_summary(report: dict) -> None:
    """Adds mlxspec's single-stream speed over ``stream_generate`` to ``report``.

    Uses the first prompt size's concurrency-1 level (the direct baseline's
    prompt). ``mlxspec_single_stream_over_stream_generate`` is the older figure
    (median level over median baseline), kept for old result files;
    ``single_stream_vs_stream_generate`` is the median of the per-repeat ratios
    (:func:`single_stream_ratios`), listed in ``single_stream_vs_stream_generate_runs``;
    it divides the level's aggregate tokens/s, whose time includes each
    request's TTFT, by a decode-only rate. ``single_stream_decode_vs_stream_generate``
    (with ``..._runs``) divides the level's median decode-only rate (tokens after the
    first over first-to-last token time, what ``generation_tps`` counts) instead:
    the like-for-like figure, in results that have it.

    Args:
        report (dict): a ``serve_bench.py`` result; changed in place. Nothing is
            added without an ``mlxspec`` concurrency-1 level and a baseline.
    """
    if "mlxspec" not in report["servers"] or "mlx_lm_stream_generate_tok_per_s" not in report:
        return
    single = [lv for lv in report["servers"]["mlxspec"]["levels"] if lv["concurrency"] == 1]
    if not single:
        return
    level, direct = single[0], report["mlx_lm_stream_generate_tok_per_s"]
    report["mlxspec_single_stream_over_stream_generate"] = level["tok_per_s"] / direct
    ratios = single_stream_ratios(
        level.get("tok_per_s_runs", [level["tok_per_s"]]),
        report.get("mlx_lm_stream_generate_tok_per_s_runs", [direct]),
    )
    report["single_stream_vs_stream_generate_runs"] = ratios
    report["single_stream_vs_stream_generate"] = statistics.median(ratios)
    decode = level.get("decode_tok_per_s_runs")
    if decode and all(decode):  # results from before the decode-only figure lack it
        ratios = single_stream_ratios(
            decode, report.get("mlx_lm_stream_generate_tok_per_s_runs", [direct])
        )
        report["single_stream_decode_vs_stream_generate_runs"] = ratios
        report["single_stream_decode_vs_stream_generate"] = statistics.median(ratios)


def plot(report: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    prompt_sizes = sorted(
        {lv["prompt_tokens"] for d in report["servers"].values() for lv in d["levels"]}
    )
    fig, axes = plt.subplots(
        1, len(prompt_sizes), figsize=(6 * len(prompt_sizes), 4), squeeze=False
    )
    for ax, n in zip(axes[0], prompt_sizes, strict=True):
        for kind, data in report["servers"].items():
            lv = [x for x in data["levels"] if x["prompt_tokens"] == n]
            ax.plot(
                [x["concurrency"] for x in lv], [x["tok_per_s"] for x in lv], marker="o", label=kind
            )
        ax.set_title(f"{report['name']}: prompt {n} tokens, {report['max_tokens']} out")
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylabel("aggregate output tokens/s")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main(argv: list[str] | None = None) -> int:
    """Prints the summary of a saved ``serve_bench.py`` result (and, with
    ``--plot``, redraws its PNG beside it); the file is not rewritten."""
    ap = argparse.ArgumentParser(description="Re-report a serve_bench.py result file.")
    ap.add_argument("result", type=Path, help="benchmarks/results/NAME.json")
    ap.add_argument("--plot", action="store_true", help="redraw NAME.png")
    args = ap.parse_args(argv)
    report = json.loads(args.result.read_text())
    summarise(report)
    if args.plot:
        plot(report, args.result.with_suffix(".png"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

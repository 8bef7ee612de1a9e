"""Reporting for ``serve_bench.py``: merging repeated runs, the printed
summary with mlxspec / mlx_lm ratios, and the PNG plot."""

from __future__ import annotations

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
    run's tokens/s kept in ``tok_per_s_runs``; the multi-turn result is the first run's."""
    levels = []
    for i, first in enumerate(runs[0]["levels"]):
        same = sorted((r["levels"][i] for r in runs), key=lambda lv: lv["tok_per_s"])
        mid = dict(same[(len(same) - 1) // 2])
        mid["tok_per_s_runs"] = [r["levels"][i]["tok_per_s"] for r in runs]
        assert mid["concurrency"] == first["concurrency"]
        levels.append(mid)
    return {"levels": levels, "multi_turn": runs[0]["multi_turn"]}


def summarise(report: dict) -> None:
    servers = report["servers"]
    if {"mlx_lm", "mlxspec"} <= servers.keys():
        ratios = []
        for a, b in zip(servers["mlxspec"]["levels"], servers["mlx_lm"]["levels"], strict=True):
            ratios.append(
                {
                    "prompt_tokens": a["prompt_tokens"],
                    "concurrency": a["concurrency"],
                    "tok_per_s_ratio": a["tok_per_s"] / max(b["tok_per_s"], 1e-9),
                    "ttft_p50_ratio": a["ttft_p50"] / max(b["ttft_p50"], 1e-9),
                }
            )
        report["ratios_mlxspec_over_mlx_lm"] = ratios
    if "mlxspec" in servers:
        single = [lv for lv in servers["mlxspec"]["levels"] if lv["concurrency"] == 1]
        if single and "mlx_lm_stream_generate_tok_per_s" in report:
            report["mlxspec_single_stream_over_stream_generate"] = (
                single[0]["tok_per_s"] / report["mlx_lm_stream_generate_tok_per_s"]
            )
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
        mt = data["multi_turn"]
        cached = [t["cached_tokens"] for t in mt["turns"]]
        print(
            f"{kind:8} multi-turn TTFT later/turn1 = {mt['ratio']:.2f} "
            f"(turn1 {mt['turn1_ttft']:.3f}s, later p50 {mt['later_ttft_p50']:.3f}s, "
            f"cached tokens per turn {cached}); repeat of the last turn: TTFT "
            f"x{mt['repeat_ratio']:.2f} ({mt['repeat']['cached_tokens']} cached)"
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
    for r in report.get("ratios_mlxspec_over_mlx_lm", []):
        print(
            f"ratio prompt {r['prompt_tokens']:5} conc {r['concurrency']:3}: "
            f"tok/s x{r['tok_per_s_ratio']:.2f}, TTFT p50 x{r['ttft_p50_ratio']:.2f}"
        )


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

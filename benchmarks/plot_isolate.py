"""Plot issue 29's benchmark: the ``--isolate`` proxy against a direct server, and
the pool's model switch and cold start.

Usage: python benchmarks/plot_isolate.py ISOLATE.json POOL.json OUT.png

ISOLATE.json is ``isolate_bench.py``'s (``runs.<direct|isolated>.<level>[]``: each
repeat's ``tok_per_s`` and ``ttft_p50`` in seconds); POOL.json is ``pool_bench.py``'s
(``switch.samples_ms.<same|switch>``, ``cold_start.first_token_s`` and
``resident_ttft_s``). Each repeat or request is a dot, the median a bar.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    iso_path, pool_path, out = argv
    iso = json.loads(Path(iso_path).read_text())
    pool = json.loads(Path(pool_path).read_text())
    fig, axes = plt.subplots(1, 4, figsize=(15, 4))
    levels = sorted(iso["runs"]["direct"], key=int)
    for ax, key, scale, label in (
        (axes[0], "tok_per_s", 1.0, "output tokens/s"),
        (axes[1], "ttft_p50", 1000.0, "TTFT p50 (ms)"),
    ):
        for i, level in enumerate(levels):
            for j, (kind, colour) in enumerate((("direct", "C0"), ("isolated", "C1"))):
                values = [r[key] * scale for r in iso["runs"][kind][level]]
                x = i * 3 + j
                ax.bar(x, statistics.median(values), color=colour, alpha=0.5)
                ax.plot([x] * len(values), values, "k.", markersize=4)
        ax.set_xticks([i * 3 + 0.5 for i in range(len(levels))], [f"c={lv}" for lv in levels])
        ax.set_ylabel(label)
    axes[0].legend(
        [plt.Rectangle((0, 0), 1, 1, color=c, alpha=0.5) for c in ("C0", "C1")],
        ["direct", "--isolate"],
    )
    axes[0].set_title("proxy: throughput")
    axes[1].set_title("proxy: time to first token")
    samples = pool["switch"]["samples_ms"]
    for x, group in enumerate(("same", "switch")):
        axes[2].bar(x, statistics.median(samples[group]), color="C2", alpha=0.5)
        axes[2].plot([x] * len(samples[group]), samples[group], "k.", markersize=4)
    axes[2].set_xticks([0, 1], ["same model\nas before", "the other\nresident model"])
    axes[2].set_ylabel("TTFT (ms)")
    axes[2].set_title("pool: model switch")
    cold = pool["cold_start"]
    for x, values in enumerate((cold["first_token_s"], cold["resident_ttft_s"])):
        axes[3].bar(x, statistics.median(values), color="C3", alpha=0.5)
        axes[3].plot([x] * len(values), values, "k.", markersize=4)
    axes[3].set_xticks([0, 1], ["not resident\n(child start)", "resident"])
    axes[3].set_ylabel("first token (s)")
    axes[3].set_title("pool: cold start")
    load = (iso["load_average_before"][0], iso["load_average_after"][0])
    pool_load = (pool["load_average_before"][0], pool["load_average_after"][0])
    fig.suptitle(
        f"mlxspec --isolate, embedded SmolLM2-135M, shared 2-core CPU (load average "
        f"{min(load):.1f}-{max(load):.1f} during the proxy runs, "
        f"{min(pool_load):.1f}-{max(pool_load):.1f} during the pool runs)"
    )
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1:])

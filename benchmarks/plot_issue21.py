"""Plot issue 21's H200 run: server tok/s against the bare model step, per row count.

Usage: python benchmarks/plot_issue21.py PROBE.json BENCH.json [BENCH.json ...] OUT.png

PROBE.json is ``step_probe.py --json`` output (ms per decode step for ``plain``: mlx-lm's
model on ``KVCache``, no mask; ``batchkv``: on ``BatchKVCache``, the left-padding mask;
``decode``: mlxspec's ``DecodeBatch`` step). A bare step of ``rows`` rows at ``ms`` per
step makes ``rows * 1000 / ms`` tokens a second. BENCH.json files are ``serve_bench.py``
results (``servers.<name>.levels[].tok_per_s`` by ``concurrency``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    probe_path, *bench_paths, out = argv
    probe = json.loads(Path(probe_path).read_text())["runs"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, label in (
        ("plain", "bare step, no mask"),
        ("batchkv", "bare step, mask"),
        ("decode", "mlxspec DecodeBatch step"),
    ):
        rows = [r["batch"] for r in probe if key in r]
        ax.plot(rows, [r["batch"] * 1000 / r[key] for r in probe if key in r], "--", label=label)
    levels: dict[str, dict[int, float]] = {}
    for path in bench_paths:
        for name, server in json.loads(Path(path).read_text())["servers"].items():
            for level in server["levels"]:
                levels.setdefault(name, {})[level["concurrency"]] = level["tok_per_s"]
    for name, by_c in levels.items():
        cs = sorted(by_c)
        ax.plot(cs, [by_c[c] for c in cs], "o-", label=f"{name} (server, streamed)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows / concurrent streams")
    ax.set_ylabel("tokens per second")
    ax.set_title("H200, 7.4B random Llama bf16, 128-token prompts, 128 output tokens")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    main(sys.argv[1:])

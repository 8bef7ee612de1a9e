"""The proxy's cost: ``mlxspec serve --isolate`` against a direct ``mlxspec serve``.

Both servers run at once on the same model; the same streamed greedy chat
workload (``serve_bench.run_level``: fixed output length, EOS forbidden) is sent
at each concurrency level to one, then the other (the order alternates between
repeats), for ``--repeats``
rounds (after one warm-up run each) so that a change in the machine's load
falls on both alike. Reports per
server and level: output tokens/s and TTFT p50, and the isolated/direct ratios;
plus the isolated child's cold start (parent start to the first answer). Writes
``benchmarks/results/<name>.json``. Run by hand, never in CI:

    python benchmarks/isolate_bench.py --name isolate-cpu --max-tokens 32
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from serve_bench import FILLER, run_level

from mlxspec.conformance.live import free_port, wait_healthy

HERE = Path(__file__).resolve().parent


def start(model: list[str], isolate: bool, log: Path) -> tuple[subprocess.Popen, str, float]:
    """Start a server; return it, its base URL and the seconds until it answered."""
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "mlxspec",
        "serve",
        *model,
        "--port",
        str(port),
        "--log-level",
        "warning",
        "--whisper-model",
        "none",
    ]
    if isolate:
        argv.append("--isolate")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, 900, proc)
    return proc, base, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="isolate")
    parser.add_argument("--model", default=None, help="default: the embedded model")
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--rounds", type=int, default=2, help="requests per worker and run")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args(argv)
    model = [args.model] if args.model else []
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    results = HERE / "results"
    load_before = os.getloadavg()
    direct, direct_base, direct_start = start(model, False, logs / f"{args.name}-direct.log")
    isolated, isolated_base, isolated_start = start(model, True, logs / f"{args.name}-isolated.log")
    prompts = [f"[{i}] " + FILLER * 3 + "\nSummarise." for i in range(16)]
    bias: dict = {}
    runs: dict[str, dict[int, list[dict]]] = {"direct": {}, "isolated": {}}
    try:
        for level in (int(x) for x in args.levels.split(",")):  # warm-up, not counted
            for base in (direct_base, isolated_base):
                asyncio.run(run_level(base, prompts, level, 1, args.max_tokens, bias, None))
        servers = [("direct", direct_base), ("isolated", isolated_base)]
        for repeat in range(args.repeats):
            for level in (int(x) for x in args.levels.split(",")):
                # the order alternates: a load change falls on the first one as often
                for kind, base in servers if repeat % 2 == 0 else servers[::-1]:
                    result = asyncio.run(
                        run_level(base, prompts, level, args.rounds, args.max_tokens, bias, None)
                    )
                    runs[kind].setdefault(level, []).append(result)
                    print(
                        f"{kind:8} c={level}: {result['tok_per_s']:.1f} tok/s, "
                        f"TTFT p50 {result['ttft_p50'] * 1000:.0f} ms",
                        flush=True,
                    )
    finally:
        for proc in (direct, isolated):
            proc.terminate()
            proc.wait(30)
    summary = {}
    for level in runs["direct"]:
        row = {}
        for kind in runs:
            row[kind] = {
                "tok_per_s": statistics.median(r["tok_per_s"] for r in runs[kind][level]),
                "ttft_p50_ms": 1000 * statistics.median(r["ttft_p50"] for r in runs[kind][level]),
            }
        row["tok_per_s_ratio"] = row["isolated"]["tok_per_s"] / row["direct"]["tok_per_s"]
        row["ttft_p50_delta_ms"] = row["isolated"]["ttft_p50_ms"] - row["direct"]["ttft_p50_ms"]
        # paired: each repeat's isolated run against the direct run beside it
        pairs = list(zip(runs["isolated"][level], runs["direct"][level], strict=True))
        row["paired_ratio_p50"] = statistics.median(
            i["tok_per_s"] / d["tok_per_s"] for i, d in pairs
        )
        row["paired_ttft_delta_p50_ms"] = 1000 * statistics.median(
            i["ttft_p50"] - d["ttft_p50"] for i, d in pairs
        )
        summary[f"c={level}"] = row
    report = {
        "name": args.name,
        "model": args.model or "embedded",
        "max_tokens": args.max_tokens,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "start_s": {"direct": direct_start, "isolated": isolated_start},
        "summary": summary,
        "runs": runs,
    }
    (results / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    print(
        json.dumps(
            {
                "start_s": report["start_s"],
                "summary": summary,
                "load": [load_before, report["load_average_after"]],
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

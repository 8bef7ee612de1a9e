"""What sharding over processes costs per decode step (issue 33), on one machine.

Starts ``mlxspec serve MODEL`` as one process, then as a group of two
(``mlx.launch -n 2 --backend ring`` on loopback; ``--pipeline`` splits layers),
and runs the same streamed greedy workload on each: ``--requests`` at once, each
exactly ``--max-tokens`` tokens (EOS forbidden with ``logit_bias``). It reports,
per server, output tokens/s over the wall time, the engine's mean milliseconds
per step (``GET /stats`` ``batch.steps`` and ``batch.solo_steps``: the model step,
the host's wait for its tokens included), and for the group the plan broadcasts
(``distributed``: turns, collectives, mean ms per broadcast, which includes waiting
for the slower rank). ``--collective`` instead times the bare broadcast: run it
under ``mlx.launch -n 2 --backend ring -- python benchmarks/dist_bench.py
--collective`` and it prints the mean microseconds of one ``all_sum`` of one int32
(an idle turn's whole cost) and of a 1 KiB plan (a turn that admits requests).

On a CPU both ranks share the machine's cores, so the group is slower than one
process: this measures what the collectives cost, not a speed-up (the run on two
GPUs is its own issue). Default model: the tests' tiny random Llama with an untied
head, built in a temporary folder.

    python benchmarks/dist_bench.py --max-tokens 64 --requests 1 4
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from mlxspec.conformance.live import free_port, wait_healthy  # noqa: E402


def collective(rounds: int) -> None:
    """Time the bare plan broadcast on this group (run under mlx.launch)."""
    import mlx.core as mx
    import numpy as np

    group = mx.distributed.init(strict=True)
    for size in (1, 256):  # int32s: an empty plan's length, a 1 KiB plan
        x = mx.zeros((size,), dtype=mx.int32)
        mx.eval(mx.distributed.all_sum(x, group=group))  # connect
        start = time.perf_counter()
        for _ in range(rounds):
            np.array(mx.distributed.all_sum(x, group=group))
        us = 1e6 * (time.perf_counter() - start) / rounds
        if group.rank() == 0:
            print(f"all_sum of {size * 4} bytes: {us:.0f} us mean over {rounds}", flush=True)


def stream_one(base: str, salt: int, max_tokens: int) -> int:
    """One streamed greedy request; returns its completion tokens (its usage)."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"request {salt}: tell me about the sea"}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "logit_bias": {"2": -100},  # the tiny tokenizer's EOS: every answer runs to max_tokens
    }
    tokens = 0
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"usage"' in line:
                usage = json.loads(line[6:]).get("usage") or {}
                tokens = usage.get("completion_tokens", tokens)
    return tokens


def steps(base: str) -> dict[str, float]:
    """Cumulative step counts and model seconds, and the group's broadcasts."""
    stats = httpx.get(f"{base}/stats", timeout=30).json()
    out: dict[str, float] = {}
    for lane in ("steps", "solo_steps"):
        t = stats["batch"][lane]
        out[lane] = t["steps"]
        out[f"{lane}_s"] = t["steps"] * t["generate_ms_mean"] / 1000
    if "distributed" in stats:
        d = stats["distributed"]
        out["plan_turns"] = d["plan_turns"]
        out["plan_s"] = d["plan_turns"] * d["plan_ms_mean"] / 1000
        out["plan_collectives"] = d["plan_collectives"]
    return out


def measure(base: str, requests: int, max_tokens: int) -> dict[str, float | None]:
    before = steps(base)
    start = time.perf_counter()
    with ThreadPoolExecutor(requests) as pool:
        tokens = sum(pool.map(lambda i: stream_one(base, i, max_tokens), range(requests)))
    wall = time.perf_counter() - start
    after = steps(base)
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    n = d["steps"] + d["solo_steps"]
    out: dict[str, float | None] = {
        "requests": requests,
        "tokens": tokens,
        "tok_per_s": round(tokens / wall, 1),
        "steps": n,
        "step_ms_mean": round(1000 * (d["steps_s"] + d["solo_steps_s"]) / n, 2) if n else None,
    }
    if "plan_turns" in d:
        turns = d["plan_turns"]
        out["plan_turns"] = turns
        out["plan_collectives_per_turn"] = (
            round(d["plan_collectives"] / turns, 3) if turns else None
        )
        out["plan_ms_mean"] = round(1000 * d["plan_s"] / turns, 3) if turns else None
    return out


def start(kind: str, model: Path, log: Path, pipeline: bool) -> tuple[subprocess.Popen, str]:
    port = free_port()
    serve = [sys.executable, "-m", "mlxspec", "serve", str(model), "--port", str(port)]
    argv = serve
    if kind == "ring-2":
        launch = str(Path(sys.executable).parent / "mlx.launch")
        ring = ["-n", "2", "--backend", "ring", "--starting-port", str(free_port())]
        argv = [launch, *ring, "--", *serve, *(["--pipeline"] if pipeline else [])]
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, 600, proc)
    return proc, base


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--pipeline", action="store_true")
    parser.add_argument("--collective", action="store_true", help="time the bare broadcast")
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args()
    if args.collective:
        collective(args.rounds)
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="dist-bench-"))
    model = args.model
    if model is None:
        from fixtures.tiny_model import build_tiny_llama

        kind = "qwen2" if args.pipeline else "llama"
        model = build_tiny_llama(tmp / "model", embed_scale=1.0, tied=False, model_type=kind)
    results: dict[str, list] = {"load_before": list(os.getloadavg())}
    for kind in ("one", "ring-2"):
        proc, base = start(kind, model, tmp / f"{kind}.log", args.pipeline)
        try:
            stream_one(base, -1, 4)  # warm
            results[kind] = [measure(base, n, args.max_tokens) for n in args.requests]
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for row in results[kind]:
            print(kind, json.dumps(row), flush=True)
    results["load_after"] = list(os.getloadavg())
    print(
        "load average (1, 5, 15 min) before", results["load_before"], "after", results["load_after"]
    )
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

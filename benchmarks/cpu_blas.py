"""What the optimised CPU BLAS and float32 CPU weights buy on MLX's CPU backend.

Each configuration runs in its own subprocess (the BLAS is chosen once per
process, before ``mlx.core`` loads; see ``mlxspec/host/blas.py``):

- ``matmul``: float32 ``(M, 576) @ (576, 1536)`` products (SmolLM2-135M's MLP
  shape) at M = 1, 8, 128, in GFLOP/s, with ``MLXSPEC_BLAS=off`` (the
  reference BLAS the ``mlx[cpu]`` wheel links) and ``auto`` (MKL).
- ``model``: the embedded SmolLM2-135M through mlx-lm: prefill seconds for a
  121-token prompt, ``generate_step`` decode tokens/s, and one decode step for
  a batch of 1 and of 8 rows over a 64-token cache (ms), for the checkpoint's
  weights (4-bit, float16) and for float32 weights, each with both BLAS.

Writes ``benchmarks/results/<name>.json``. Run by hand, never in CI:

    python benchmarks/cpu_blas.py --name cpu-blas
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

# Before anything imports mlx.core: mlxspec loads the BLAS MLXSPEC_BLAS names.
import mlxspec  # noqa: E402, F401


def matmul_probe() -> dict:
    import mlx.core as mx

    out = {}
    w = mx.random.normal((1536, 576))
    for m in (1, 8, 128):
        a = mx.random.normal((m, 576))
        mx.eval(a, w, a @ w.T)
        runs = 30
        start = time.perf_counter()
        for _ in range(runs):
            mx.eval(a @ w.T)
        seconds = (time.perf_counter() - start) / runs
        out[f"M={m}"] = round(2 * m * 576 * 1536 / seconds / 1e9, 2)
    return out


def model_probe(weights: str) -> dict:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    from mlxspec.engine.model.cpu_weights import apply_cpu_weights
    from mlxspec.engine.model.loader import resolve_model

    model, tok = load(str(resolve_model(None).path))
    done = apply_cpu_weights(model, "float32" if weights == "float32" else "native")
    prompt = mx.array(tok.encode("Tell me a long story about a dragon and a knight. " * 10))
    start = time.perf_counter()
    steps = 0
    for _, _ in zip(generate_step(prompt, model, max_tokens=33), range(33), strict=False):
        if steps == 0:
            first = time.perf_counter()
        steps += 1
    decode = (steps - 1) / (time.perf_counter() - first)
    out = {"float32": done.float32, "weights_mib": done.nbytes >> 20}
    out["prefill_s"] = round(first - start, 3)
    out["decode_tok_per_s"] = round(decode, 2)
    for rows in (1, 8):
        cache = make_prompt_cache(model)
        mx.eval(model(mx.array([[5] * 64] * rows), cache=cache))
        step = mx.array([[7]] * rows)
        mx.eval(model(step, cache=cache))
        start = time.perf_counter()
        for _ in range(5):
            mx.eval(model(step, cache=cache))
        out[f"step_ms_rows={rows}"] = round((time.perf_counter() - start) / 5 * 1000, 1)
    return out


def run_probe(probe: str, blas: str, weights: str = "native") -> dict:
    env = {**os.environ, "MLXSPEC_BLAS": blas, "HF_HUB_OFFLINE": "1"}
    code = (
        f"import json, sys; sys.path.insert(0, {str(HERE.parent)!r});"
        f"from benchmarks.cpu_blas import {probe}_probe as p;"
        f"print(json.dumps(p({weights!r}) if {probe!r} == 'model' else p()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="cpu-blas")
    args = ap.parse_args(argv)
    report: dict = {
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count()},
        "matmul_gflops": {},
        "model": {},
    }
    for blas in ("off", "auto"):
        report["matmul_gflops"][blas] = run_probe("matmul", blas)
        print("matmul", blas, report["matmul_gflops"][blas], flush=True)
    for weights in ("native", "float32"):
        for blas in ("off", "auto"):
            key = f"{weights}/{blas}"
            report["model"][key] = run_probe("model", blas, weights)
            print("model", key, report["model"][key], flush=True)
    path = HERE / "results" / f"{args.name}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Mixed-adapter batching: 8 streams on 8 different LoRA adapters against 8 on one
adapter and 8 on none, on ``mlxspec serve`` and on ``mlx_lm.server``'s
per-request adapter path, the same workload on the same model.

Makes ``--adapters`` random rank-``--rank`` adapters for the model
(``fixtures/random_adapters.py``: every linear layer of every block, as
``mlx_lm.lora`` with ``num_layers: -1``), starts ``mlxspec serve MODEL --batch N
--prompt-cache-bytes 0`` and mounts them over ``POST /v1/adapters``; with
``--mlx-lm`` also ``mlx_lm.server --prompt-cache-size 0`` (no prompt cache on
either, and every round's prompts are new, so no round is served from a cache).
Three workloads of ``--streams`` concurrent streamed greedy chats, EOS forbidden
with ``logit_bias`` (fixed output length):

* ``none``: every stream on the base model;
* ``same``: every stream with adapter 0;
* ``mixed``: stream ``i`` with adapter ``i`` (all in one batch on mlxspec).

mlxspec selects a mounted id (``"adapter": "a3"``); mlx_lm.server gets
``"model": MODEL, "adapters": FOLDER`` in the body (``mlx_lm/server.py``
``ModelProvider.load``: for its ``default_model`` it always takes the
``--adapter-path`` of its command line). It reloads the model whenever the
adapter differs from the loaded one and batches only requests of one model key
(``_generate``'s ``drain_batch``), so its mixed round runs one adapter at a time.

The runs alternate: each round visits both servers (their order swaps every
round) and the three workloads (rotated every round), each cell after a one-token
warm-up of its first stream (mlx_lm.server loads that stream's adapter then, so
its ``same`` and ``none`` rounds pay no load; its ``mixed`` cell, whose seven
reloads a round dominate it, runs ``--mlx-lm-mixed-rounds`` times: once with
``--preset h200``). A cell reports aggregate output tokens/s (all streams'
completion tokens over the round's wall time), TTFT and inter-token gap medians;
the summary is the median over rounds per server and workload, and
``mixed_over_same`` (target >= 0.8 for mlxspec, issue 19). No cell starts once
``--budget-s`` seconds have passed since the script started; a cell that fails
(an HTTP error, an in-band stream error) is kept in ``failures`` and the next one
runs. ``gather_check`` records whether the device runs the mixed path's
``gather_mm`` products at all (in a child process, before the servers start).
The JSON is rewritten after every cell (``--json``, default ``benchmarks/results/<name>.json``;
the servers' logs beside it), then a PNG plot::

    python benchmarks/adapters_bench.py --name adapters-cpu --mlx-lm   # SmolLM2-135M shapes
    python benchmarks/adapters_bench.py --preset h200 --name adapters-h200-8b --mlx-lm
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from serve_bench import KIND_ENV, build_prompt

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fixtures.random_adapters import make_random_adapter  # noqa: E402
from mlxspec.conformance.live import free_port, wait_healthy  # noqa: E402

WORKLOADS = ("none", "same", "mixed")
SERVERS = ("mlxspec", "mlx_lm")
#: Defaults per machine. ``cpu``: a random float32 model of SmolLM2-135M's shapes
#: made here (``make_random_model.py --size 135m``: on a CPU mlxspec holds weights as
#: float32 for the BLAS, mlx_lm.server computes in the checkpoint's dtype, so a
#: float32 checkpoint gives both the same numbers), a few minutes; ``h200``: the
#: random 7.4B Llama (``h200.sh setup 8b``), under 8 minutes with both servers' starts.
PRESETS = {
    "cpu": {"model": None, "max_tokens": 24, "prompt_tokens": 64, "rounds": 3, "budget_s": 1200},
    "h200": {
        "model": "/tmp/rand8b",
        "max_tokens": 128,
        "prompt_tokens": 256,
        "rounds": 3,
        "budget_s": 360,  # from the script's start: the H200 call ends within 8 minutes
        # its reloads (7 per round) dominate, not noise: one round is its figure
        "mlx_lm_mixed_rounds": 1,
    },
}


def start(command: list[str], log: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """Start a server on a free port; returns it and its base URL once healthy."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    full = {**os.environ, "HF_HUB_OFFLINE": "1", **env}
    proc = subprocess.Popen(
        [*command, "--port", str(port)], stdout=log.open("w"), stderr=subprocess.STDOUT, env=full
    )
    try:
        wait_healthy(base, 900, proc)
    except (RuntimeError, TimeoutError):
        proc.kill()
        raise RuntimeError(f"{command[:4]} did not start: {log.read_text()[-2000:]}") from None
    return proc, base


async def stream(client: httpx.AsyncClient, base: str, body: dict) -> dict:
    """One streamed chat: TTFT and chunk gaps (seconds), completion tokens."""
    t0 = time.perf_counter()
    stamps, usage = [], None
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("error"):  # an in-band failure: the cell fails, not a slow count
                raise RuntimeError(f"stream error: {json.dumps(chunk['error'])[:500]}")
            usage = chunk.get("usage") or usage
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                stamps.append(time.perf_counter())
    return {
        "ttft": (stamps[0] if stamps else time.perf_counter()) - t0,
        "gaps": [b - a for a, b in zip(stamps, stamps[1:], strict=False)],
        "tokens": (usage or {}).get("completion_tokens") or len(stamps),
    }


async def round_of(base: str, bodies: list[dict]) -> dict:
    """All ``bodies`` streamed at once: the round's aggregate figures."""
    limits = httpx.Limits(max_connections=len(bodies) + 4)
    async with httpx.AsyncClient(timeout=3600, limits=limits) as client:
        t0 = time.perf_counter()
        results = await asyncio.gather(*(stream(client, base, b) for b in bodies))
        wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    gaps = [g for r in results for g in r["gaps"]]
    return {
        "wall_s": wall,
        "output_tokens": tokens,
        "tok_per_s": tokens / wall,
        "ttft_p50": statistics.median(r["ttft"] for r in results),
        "ttft_max": max(r["ttft"] for r in results),
        "itl_p50": statistics.median(gaps) if gaps else None,
    }


def bodies(server: str, workload: str, texts: list[str], folders: list[Path], args) -> list[dict]:
    """One round's streams: mlxspec names mounted ids, mlx_lm.server folders."""
    out = []
    for i, text in enumerate(texts):
        body = {
            "messages": [{"role": "user", "content": text}],
            "max_tokens": args.max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "logit_bias": args.bias,
        }
        pick = {"none": None, "same": 0, "mixed": i % len(folders)}[workload]
        if pick is not None and server == "mlxspec":
            body["adapter"] = f"a{pick}"
        elif pick is not None:  # mlx_lm.server: a model other than default_model, see above
            body["model"], body["adapters"] = args.model, str(folders[pick])
        out.append(body)
    return out


def summarise(cells: dict) -> dict:
    """Median tok/s per server and workload over its rounds, and the ratios."""
    out: dict = {}
    for server, by_workload in cells.items():
        med = {w: statistics.median(r["tok_per_s"] for r in rs) for w, rs in by_workload.items()}
        if {"mixed", "same"} <= med.keys():
            med["mixed_over_same"] = med["mixed"] / med["same"]
        if {"same", "none"} <= med.keys():
            med["same_over_none"] = med["same"] / med["none"]
        out[server] = med
    if len(out) == 2:
        ours, theirs = out["mlxspec"], out["mlx_lm"]
        out["mlxspec_over_mlx_lm"] = {w: ours[w] / theirs[w] for w in WORKLOADS if w in theirs}
    return out


def mount_all(base: str, folders: list[Path]) -> list[dict]:
    """Mount ``folders`` on mlxspec as ``a0``, ``a1``...; each answer and its seconds."""
    mounted = []
    for i, folder in enumerate(folders):
        t0 = time.perf_counter()
        r = httpx.post(
            f"{base}/v1/adapters", json={"id": f"a{i}", "path": str(folder)}, timeout=900
        )
        r.raise_for_status()
        mounted.append({**r.json(), "mount_s": time.perf_counter() - t0})
    return mounted


#: mlx_lm.server with the CBLAS that mlxspec loads on a Linux CPU (MKL,
#: ``mlxspec/host/blas.py``: importing mlxspec installs it before mlx.core), so both
#: servers multiply the same float32 weights with the same BLAS on the CPU.
MLX_LM_WITH_BLAS = (
    "import sys, runpy, mlxspec; sys.argv[0] = 'mlx_lm.server'; "
    "runpy.run_module('mlx_lm.server', run_name='__main__')"
)


def commands(args) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each server's command line (port added by :func:`start`) and environment."""
    ours = [sys.executable, "-m", "mlxspec", "serve", args.model, "--batch", str(args.streams)]
    ours += ["--prompt-cache-bytes", "0", "--log-level", "warning"]
    launch = ["-c", MLX_LM_WITH_BLAS] if args.preset == "cpu" else ["-m", "mlx_lm.server"]
    theirs = [sys.executable, *launch, "--model", args.model, "--prompt-cache-size", "0"]
    theirs += ["--log-level", "WARNING", "--decode-concurrency", str(max(args.streams, 32))]
    # mlxspec serve's MLX defaults (cuDNN attention off), like for like
    return {"mlxspec": (ours, {}), "mlx_lm": (theirs, KIND_ENV["mlx_lm-nocudnn"][1])}


def schedule(args, servers: tuple[str, ...]) -> list[tuple[int, str, str]]:
    """The cells in the order run: ``(round, server, workload)``, alternated."""
    cells = []
    for r in range(args.rounds):
        for server in servers if r % 2 == 0 else servers[::-1]:
            for workload in WORKLOADS[r % 3 :] + WORKLOADS[: r % 3]:
                if (server, workload) != ("mlx_lm", "mixed") or r < args.mlx_lm_mixed_rounds:
                    cells.append((r, server, workload))
    return cells


def measure_cell(args, tokenizer, base: str, cell: tuple[int, str, str], folders) -> dict:
    """One cell: new prompts (salted by the cell), a one-token warm-up, the round."""
    r, server, workload = cell
    salt = 10_000 * (r + 1) + 1000 * SERVERS.index(server) + 100 * WORKLOADS.index(workload)
    texts = [build_prompt(tokenizer, args.prompt_tokens, salt + i) for i in range(args.streams)]
    batch = bodies(server, workload, texts, folders, args)
    asyncio.run(round_of(base, [{**batch[0], "max_tokens": 1}]))
    return {"round": r, **asyncio.run(round_of(base, batch))}


def run(args, tokenizer, folders: list[Path], report: dict, save, began: float) -> None:
    """Start the servers, mount, then the alternated cells (see the module docstring);
    the servers' logs go beside the JSON as they run."""
    servers = SERVERS if args.mlx_lm else SERVERS[:1]
    procs, bases = {}, {}
    try:
        for server in servers:
            command, env = commands(args)[server]
            t0 = time.perf_counter()
            log = args.json.parent / f"{args.json.stem}-{server}.log"
            procs[server], bases[server] = start(command, log, env)
            report["start_s"][server] = time.perf_counter() - t0
        report["mounts"] = mount_all(bases["mlxspec"], folders)
        cells: dict = report.setdefault("cells", {s: {w: [] for w in WORKLOADS} for s in servers})
        for cell in schedule(args, servers):
            if time.perf_counter() - began > args.budget_s:
                report["stopped"] = f"{args.budget_s:.0f}s budget spent before {cell}"
                return
            try:
                found = measure_cell(args, tokenizer, bases[cell[1]], cell, folders)
            except (RuntimeError, httpx.HTTPError) as exc:  # kept, and the next cell runs
                report.setdefault("failures", []).append({"cell": cell, "error": str(exc)[:800]})
                save()
                print(f"round {cell[0]} {cell[1]} {cell[2]} failed: {exc}", flush=True)
                continue
            cells[cell[1]][cell[2]].append(found)
            report["summary"] = summarise(
                {s: {w: c for w, c in v.items() if c} for s, v in cells.items()}
            )
            save()
            print(
                f"round {cell[0]} {cell[1]:8s} {cell[2]:6s} {found['tok_per_s']:8.1f} tok/s "
                f"ttft {found['ttft_p50']:.2f}s itl {found['itl_p50'] or 0:.4f}s",
                flush=True,
            )
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(60)


def plot(report: dict, path: Path) -> None:
    """Bars: median tok/s per workload and server, every round as a dot."""
    try:
        import matplotlib
    except ImportError:  # the H200's bare site: re-plot here with --replot
        print("matplotlib not installed: no plot")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cells = report.get("cells") or {}
    fig, ax = plt.subplots(figsize=(7, 4))
    width = 0.8 / max(len(cells), 1)
    for k, (server, by_workload) in enumerate(cells.items()):
        xs = [i + (k - (len(cells) - 1) / 2) * width for i in range(len(WORKLOADS))]
        meds = [report["summary"][server].get(w, 0) for w in WORKLOADS]
        ax.bar(xs, meds, width, label=server, alpha=0.8)
        for x, w in zip(xs, WORKLOADS, strict=True):
            runs = [c["tok_per_s"] for c in by_workload[w]]
            ax.plot([x] * len(runs), runs, "k.", markersize=4)
        for x, m in zip(xs, meds, strict=True):
            ax.annotate(f"{m:.3g}", (x, m), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(
        range(len(WORKLOADS)),
        ["no adapter", "one adapter", f"{report['adapters']} adapters mixed"],
    )
    ax.set_ylabel("aggregate output tokens/s (median of rounds)")
    ratio = report["summary"]["mlxspec"].get("mixed_over_same")
    title = f"{report['name']}: {report['streams']} streams, rank {report['rank']}"
    ax.set_title(title + (f", mlxspec mixed/same x{ratio:.2f}" if ratio else ""), fontsize=10)
    ax.grid(alpha=0.3, axis="y")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


#: The mixed path's products on the device, alone (``AdapterLinear``: ``gather_mm``
#: of bfloat16 rows against float32 stacks, one row per adapter, at a decode step and
#: a prefill chunk), so a backend that lacks a case names it before the servers start.
GATHER_CHECK = """
import sys, mlx.core as mx
hidden, rank, rows, length = map(int, sys.argv[1:])
a = mx.zeros((rows + 1, hidden, rank)); b = mx.zeros((rows + 1, rank, hidden))
idx = mx.arange(rows, dtype=mx.int32) + 1
for n in (1, length):
    x = mx.zeros((rows, n, hidden), dtype=mx.bfloat16)
    mx.eval(mx.gather_mm(mx.gather_mm(x, a, rhs_indices=idx), b, rhs_indices=idx))
print(mx.default_device(), "gather_mm ok at", (rows, 1, hidden), "and", (rows, length, hidden))
"""


def gather_check(args) -> str:
    """:data:`GATHER_CHECK` in a child process: its last output line."""
    hidden = json.loads((Path(args.model) / "config.json").read_text())["hidden_size"]
    shape = [str(v) for v in (hidden, args.rank, args.streams, args.prompt_tokens)]
    done = subprocess.run(
        [sys.executable, "-c", GATHER_CHECK, *shape], capture_output=True, text=True, timeout=300
    )
    lines = (done.stdout + done.stderr).strip().splitlines() or [f"exit {done.returncode}"]
    return lines[-1][:500]


def random_cpu_model(out: Path) -> Path:
    """A random float32 model of SmolLM2-135M's shapes and tokenizer in ``out``."""
    from make_random_model import main as make_model

    from mlxspec.engine.model.loader import resolve_model

    embedded = resolve_model(None).path
    make_model(
        [str(out), "--size", "135m", "--dtype", "float32", "--tokenizer-from", str(embedded)]
    )
    return out


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="cpu")
    ap.add_argument("--model", help="MLX model folder (cpu: a random one of SmolLM2-135M's shapes)")
    ap.add_argument("--name", default="adapters-cpu")
    ap.add_argument("--json", type=Path, help="result file (default results/<name>.json)")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--adapters", type=int, help="adapters made and mixed (default --streams)")
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--prompt-tokens", type=int)
    ap.add_argument("--rounds", type=int)
    ap.add_argument("--budget-s", type=float, help="no cell starts after this many seconds")
    ap.add_argument("--mlx-lm", action="store_true", help="also measure mlx_lm.server")
    ap.add_argument("--mlx-lm-mixed-rounds", type=int, help="rounds of its mixed cell")
    ap.add_argument("--replot", type=Path, help="only plot this saved result beside it")
    args = ap.parse_args(argv)
    for key, value in PRESETS[args.preset].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.adapters = args.adapters or args.streams
    args.mlx_lm_mixed_rounds = args.mlx_lm_mixed_rounds or args.rounds
    args.json = args.json or HERE / "results" / f"{args.name}.json"
    return args


def main(argv: list[str] | None = None) -> int:
    began = time.perf_counter()
    args = parse(argv)
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.replot.with_suffix(".png"))
        return 0
    from mlx_lm.utils import load_tokenizer

    tmp = tempfile.TemporaryDirectory()
    root = Path(tmp.name)  # the adapters (and the cpu preset's model)
    args.model = str(args.model or random_cpu_model(root / "model"))
    tokenizer = load_tokenizer(Path(args.model))
    args.bias = {str(t): -1e9 for t in tokenizer.eos_token_ids}
    layers = json.loads((Path(args.model) / "config.json").read_text())["num_hidden_layers"]
    report: dict = {
        "name": args.name,
        "model": args.model,
        "preset": args.preset,
        "platform": platform.platform(),
        "rank": args.rank,
        "adapters": args.adapters,
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "prompt_tokens": args.prompt_tokens,
        "rounds": args.rounds,
        "budget_s": args.budget_s,
        "mlx_lm_mixed_rounds": args.mlx_lm_mixed_rounds,
        "mlx_lm_launch": commands(args)["mlx_lm"][0][1:3],
        "start_s": {},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")

    with tmp:
        t0 = time.perf_counter()
        folders = [
            make_random_adapter(
                Path(args.model),
                root / f"a{i}",
                rank=args.rank,
                scale=2.0,
                num_layers=layers,
                seed=i,
                std=0.01,
            )
            for i in range(args.adapters)
        ]
        report["adapter_bytes"] = (folders[0] / "adapters.safetensors").stat().st_size
        report["make_adapters_s"] = time.perf_counter() - t0
        report["gather_check"] = gather_check(args)
        print(report["gather_check"], flush=True)
        try:
            run(args, tokenizer, folders, report, save, began)
        finally:
            save()
    if report.get("summary"):
        plot(report, args.json.with_suffix(".png"))
    print(json.dumps(report.get("summary"), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The model pool's costs: a switch between two resident models, and a cold start.

One ``mlxspec serve --isolate --model-pool B C`` parent on the embedded model
(the default, ``A``) and two copies of it under other names (hard links to the
same files, so ``B`` and ``C`` are other pool ids with the same weights, and a
TTFT difference is the pool's, not the model's):

- **switch**: ``A`` and ``B`` both resident; streamed short chats (4 tokens) in the
  order ``A A B B A A B B ...`` (every prompt new). A request whose model differs
  from the previous request's is a *switch*, else *same*; the switch cost is the
  median TTFT of the switches less that of the others (both models take part
  in both groups equally).
- **cold start**: ``C`` is not resident; each request to it (``keep_alive: 0``,
  so it is stopped again after answering) starts its child: the seconds from
  sending the request to its first token, against ``C``'s TTFT once resident.

Writes ``benchmarks/results/<name>.json``. Run by hand, never in CI:

    python benchmarks/pool_bench.py --name pool-cpu --switches 24 --colds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from isolate_bench import start
from serve_bench import read_chat_stream

HERE = Path(__file__).resolve().parent


def copies(names: list[str]) -> tuple[Path, list[Path]]:
    """Folders ``names`` holding the embedded model's files (hard links where possible)."""
    from mlxspec.engine.model.loader import resolve_model

    source = Path(resolve_model(None).path)
    root = Path(tempfile.mkdtemp(prefix="pool-bench-"))
    folders = []
    for name in names:
        target = root / name
        try:
            shutil.copytree(source, target, copy_function=os.link)
        except OSError:  # another file system: a plain copy
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)
        folders.append(target)
    return root, folders


async def ttft(client: httpx.AsyncClient, base: str, model: str, prompt: str, **extra) -> float:
    """Seconds from sending a streamed short chat on ``model`` to its first token.

    ``extra``: more body fields (``keep_alive``)."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        **extra,
    }
    t0 = time.perf_counter()
    stamps, _, _ = await read_chat_stream(client, base, body)
    if not stamps:
        raise RuntimeError(f"no token from {model}")
    return stamps[0] - t0


async def resident(client: httpx.AsyncClient, base: str) -> list[str]:
    """The pool's resident ids (``GET /engine``)."""
    return (await client.get(f"{base}/engine")).json()["pool"]["resident"]


async def measure(base: str, ids: list[str], switches: int, colds: int) -> dict:
    """The switch and cold-start measurements (see the module)."""
    a, b, c = ids
    prompt = "[{}] Name one colour."
    async with httpx.AsyncClient(timeout=900) as client:
        for model in (a, b, a, b):  # both resident and warm
            await ttft(client, base, model, prompt.format(f"warm-{model}"))
        groups: dict[str, list[float]] = {"same": [], "switch": []}
        previous = b
        for i in range(switches):
            model = (a, a, b, b)[i % 4]
            seconds = await ttft(client, base, model, prompt.format(i))
            groups["same" if model == previous else "switch"].append(seconds)
            previous = model
        cold: list[float] = []
        for i in range(colds):
            while c in await resident(client, base):  # the last one still stopping
                await asyncio.sleep(0.2)
            cold.append(await ttft(client, base, c, prompt.format(f"cold-{i}"), keep_alive=0))
        warm_c: list[float] = []
        for i in range(3):  # resident: keep_alive -1 keeps it
            warm_c.append(await ttft(client, base, c, prompt.format(f"warm-c-{i}"), keep_alive=-1))
    same, switch = statistics.median(groups["same"]), statistics.median(groups["switch"])
    return {
        "switch": {
            "ttft_same_p50_ms": 1000 * same,
            "ttft_switch_p50_ms": 1000 * switch,
            "switch_cost_p50_ms": 1000 * (switch - same),
            "samples_ms": {k: [1000 * x for x in v] for k, v in groups.items()},
        },
        "cold_start": {
            "first_token_s": cold,
            "first_token_p50_s": statistics.median(cold),
            "resident_ttft_s": warm_c[1:],
            "resident_ttft_p50_s": statistics.median(warm_c[1:]),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="pool")
    parser.add_argument("--switches", type=int, default=24)
    parser.add_argument("--colds", type=int, default=3)
    args = parser.parse_args(argv)
    root, (b, c) = copies(["smol-b", "smol-c"])
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    load_before = os.getloadavg()
    flags = ["--model-pool", str(b), str(c)]
    proc, base, started = start(flags, True, logs / f"{args.name}-parent.log")
    try:
        ids = httpx.get(f"{base}/engine", timeout=30).json()["pool"]["models"]
        t0 = time.perf_counter()
        result = asyncio.run(measure(base, ids, args.switches, args.colds))
        wall = time.perf_counter() - t0
    finally:
        proc.terminate()
        proc.wait(60)
        shutil.rmtree(root, ignore_errors=True)
    report = {
        "name": args.name,
        "models": ids,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "parent_start_s": started,
        "wall_s": wall,
        **result,
    }
    (HERE / "results" / f"{args.name}.json").write_text(json.dumps(report, indent=1))
    summary = {k: v for k, v in report.items() if k != "switch"}
    summary["switch"] = {k: v for k, v in result["switch"].items() if k != "samples_ms"}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

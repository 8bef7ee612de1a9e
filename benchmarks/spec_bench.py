"""Speculative decoding, side by side: mlxspec without drafts, with prompt-lookup
drafts (``--draft-kind ngram``) and with a draft model, against mlx_lm.server
without and with its ``--draft-model`` on the same pair, on repetitive tasks (edit
a given code file, summarise a given text) and free generation, at c=1 and c=8.

Each server runs in its own process, one after the other, greedy (temperature
0), every request streamed; a level's decode rate is its completion tokens over
the time from the first token to the last of each request, summed over the
level's requests, and its throughput the level's tokens over its wall time. The
draft model defaults to the embedded SmolLM2 re-quantised to 3 bits
(``fixtures/draft_model.py``), built once under ``--work``.

    PYTHONPATH=$PWD python benchmarks/spec_bench.py --name cpu
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
from serve_bench import read_chat_stream

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mlxspec.conformance.live import free_port, wait_healthy  # noqa: E402

CODE = "\n".join(
    [
        "import json",
        "",
        "",
        "def load_orders(path):",
        "    with open(path) as f:",
        "        return json.load(f)",
        "",
        "",
        "def order_total(order):",
        "    total = 0",
        "    for line in order['lines']:",
        "        total = total + line['price'] * line['count']",
        "    return total",
        "",
        "",
        "def report(orders):",
        "    for order in orders:",
        "        print(order['id'], order_total(order))",
        "",
        "",
        "if __name__ == '__main__':",
        "    report(load_orders('orders.json'))",
    ]
)
TEXT = (
    "The town of Millbrook sits where two rivers meet. In spring the rivers rise, and in "
    "the spring of 1903 they rose higher than anyone remembered. The water covered the "
    "market square, the mill and the lower streets. The miller, Anna Brook, moved her "
    "family to the church on the hill. When the water fell, the mill was ruined. The "
    "town raised money to rebuild it, and the new mill opened a year later, with a "
    "stone wall along the river to keep the next flood out. The wall still stands."
)
TASKS = {
    "edit": (
        f"Here is my code:\n\n```python\n{CODE}\n```\n\nRewrite the whole file with the "
        "function order_total renamed to total_of. Reply with only the code."
    ),
    "summarise": f"Summarise this text by repeating its key sentences word for word:\n\n{TEXT}",
    "free": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def command(kind: str, model: str, draft: str, port: int, k: int) -> list[str]:
    """The server command line of ``kind``."""
    mlxspec = [sys.executable, "-m", "mlxspec", "serve", model, "--port", str(port)]
    mlxspec += ["--batch", "8", "--log-level", "warning", "--whisper-model", "none"]
    mlx_lm = [sys.executable, "-m", "mlx_lm.server", "--model", model, "--port", str(port)]
    mlx_lm += ["--log-level", "WARNING"]
    return {
        "mlxspec": mlxspec,
        "mlxspec-ngram": [*mlxspec, "--draft-kind", "ngram", "--num-draft-tokens", str(k)],
        "mlxspec-draft": [*mlxspec, "--draft-model", draft, "--num-draft-tokens", str(k)],
        "mlx_lm": mlx_lm,
        "mlx_lm-draft": [*mlx_lm, "--draft-model", draft, "--num-draft-tokens", str(k)],
    }[kind]


async def one(client: httpx.AsyncClient, base: str, task: str, max_tokens: int) -> dict:
    """One streamed greedy chat request."""
    body = {
        "messages": [{"role": "user", "content": TASKS[task]}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    stamps, text, usage = await read_chat_stream(client, base, body)
    usage = usage or {}
    tokens = usage.get("completion_tokens") or len(stamps)
    return {
        "tokens": tokens,
        "decode_s": stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0,
        "ttft": stamps[0] - start if stamps else None,
        "text": text,
        "speculation": usage.get("speculation"),
    }


async def level(base: str, task: str, conc: int, max_tokens: int) -> dict:
    """``conc`` concurrent requests of ``task``; decode and wall rates."""
    async with httpx.AsyncClient(timeout=1200) as client:
        await one(client, base, task, 8)  # warm the path (prompt cache aside: same for all)
        start = time.perf_counter()
        runs = await asyncio.gather(*(one(client, base, task, max_tokens) for _ in range(conc)))
        wall = time.perf_counter() - start
    tokens = sum(r["tokens"] for r in runs)
    decode = sum(r["tokens"] - 1 for r in runs) / max(1e-9, sum(r["decode_s"] for r in runs))
    spec = [r["speculation"] for r in runs if r["speculation"]]
    return {
        "task": task,
        "concurrency": conc,
        "tokens": tokens,
        "wall_s": round(wall, 3),
        "throughput_tps": round(tokens / wall, 2),
        "decode_tps_per_stream": round(decode, 2),
        "accepted": sum(s["accepted"] for s in spec) if spec else None,
        "drafted": sum(s["drafted"] for s in spec) if spec else None,
        "text0": runs[0]["text"][:120],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="target model folder (default: the embedded SmolLM2)")
    ap.add_argument("--draft", help="draft model folder (default: the target at 3 bits)")
    ap.add_argument("--name", default="spec")
    ap.add_argument("--work", default="/tmp/spec_bench")
    ap.add_argument(
        "--kinds",
        nargs="+",
        default=["mlxspec", "mlxspec-ngram", "mlxspec-draft", "mlx_lm", "mlx_lm-draft"],
    )
    ap.add_argument("--tasks", nargs="+", default=list(TASKS))
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--num-draft-tokens", type=int, default=4)
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        from mlxspec.engine.model.loader import resolve_model

        model = str(resolve_model(None).path)
    draft = args.draft
    if draft is None and any("draft" in k for k in args.kinds):
        draft = str(work / "draft-q3")
        if not (Path(draft) / "config.json").exists():
            from fixtures.draft_model import build_low_bit_draft

            build_low_bit_draft(Path(model), Path(draft), bits=3)
    load = os.getloadavg()
    results: dict = {"model": model, "draft": draft, "loadavg_start": load, "levels": {}}
    out = HERE / "results" / f"{args.name}.json"
    for kind in args.kinds:
        port = free_port()
        log = open(work / f"{kind}.log", "w")
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        proc = subprocess.Popen(
            command(kind, model, draft or "", port, args.num_draft_tokens),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            wait_healthy(base, 600, proc)
            rows = []
            for task in args.tasks:
                for conc in args.concurrency:
                    row = asyncio.run(level(base, task, conc, args.max_tokens))
                    row["loadavg"] = os.getloadavg()[0]
                    rows.append(row)
                    print(
                        kind, json.dumps({k: v for k, v in row.items() if k != "text0"}), flush=True
                    )
            results["levels"][kind] = rows
        finally:
            proc.terminate()
            proc.wait(30)
        results["loadavg_end"] = os.getloadavg()
        out.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

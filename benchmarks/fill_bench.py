"""Token fast-forwarding (``--fill strict``), side by side: the same server
without and with fill on tool-call-heavy output: forced tool calls (the call's
name and argument keys are fixed) and structured output with long fixed keys,
at c=1 and c=8, greedy, not streamed.

Each server runs in its own process, one after the other, answering the same
requests; a level's rate is its completion tokens over its wall time. The
answers of the two servers are compared (greedy output must be identical) and
the replies' ``usage.fill`` summed (the share of tokens fed rather than
sampled).

    PYTHONPATH=$PWD python benchmarks/fill_bench.py --name fill-cpu
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

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from mlxspec.conformance.live import free_port, wait_healthy  # noqa: E402

ORDER = {
    "type": "object",
    "properties": {
        "customer_identifier": {"type": "string", "maxLength": 12},
        "shipping_address_line": {"type": "string", "maxLength": 24},
        "requested_delivery_window": {"enum": ["morning", "afternoon", "evening"]},
        "express_shipping_requested": {"type": "boolean"},
        "gift_wrapping_requested": {"type": "boolean"},
    },
    "required": [
        "customer_identifier",
        "shipping_address_line",
        "requested_delivery_window",
        "express_shipping_requested",
        "gift_wrapping_requested",
    ],
    "additionalProperties": False,
}
TOOL = {
    "type": "function",
    "function": {
        "name": "schedule_customer_delivery",
        "description": "Schedule the delivery of an order.",
        "parameters": ORDER,
    },
}
ASKS = [
    "Ship order 1182 to 12 Harbour Road for Anna Berg, in the morning, as a gift.",
    "Deliver to customer C-991 at 4 Mill Lane tomorrow evening, express please.",
    "Customer 77-A wants their parcel at 9 Elm Street in the afternoon.",
    "Please send the order for Ole Hansen to Storgata 5, no gift wrap, express.",
    "Schedule delivery for client 5521 at 1 Quay Street, evening window.",
    "Book a delivery: customer K-12, 88 King Road, morning, gift wrapped.",
    "Order for Mia Lund, 3 Park Avenue, afternoon, not express.",
    "Send customer 4040's order to 21 Bridge Street, evening, express and gift.",
]
TASKS = ("tool_call", "schema")


def body(task: str, ask: str, max_tokens: int) -> dict:
    """One request of ``task``: a forced tool call, or structured output."""
    messages = [{"role": "user", "content": ask}]
    out: dict = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if task == "tool_call":
        named = {"type": "function", "function": {"name": "schedule_customer_delivery"}}
        return {**out, "tools": [TOOL], "tool_choice": named}
    schema = {"name": "order", "schema": ORDER}
    return {**out, "response_format": {"type": "json_schema", "json_schema": schema}}


async def level(base: str, task: str, conc: int, max_tokens: int) -> dict:
    """``conc`` requests at once (``conc`` of :data:`ASKS`, cycled)."""
    asks = [ASKS[i % len(ASKS)] for i in range(conc)]
    async with httpx.AsyncClient(timeout=1200) as client:
        start = time.perf_counter()
        replies = await asyncio.gather(
            *(
                client.post(f"{base}/v1/chat/completions", json=body(task, a, max_tokens))
                for a in asks
            )
        )
        wall = time.perf_counter() - start
    answers, tokens, injected = [], 0, 0
    for r in replies:
        r.raise_for_status()
        data = r.json()
        message = data["choices"][0]["message"]
        answers.append(
            message.get("tool_calls")
            and [c["function"] for c in message["tool_calls"]]
            or message["content"]
        )
        tokens += data["usage"]["completion_tokens"]
        injected += data["usage"].get("fill", {}).get("injected", 0)
    return {
        "task": task,
        "concurrency": conc,
        "wall_s": round(wall, 3),
        "tokens": tokens,
        "tok_s": round(tokens / wall, 2),
        "injected": injected,
        "answers": answers,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="model folder (default: the embedded model)")
    ap.add_argument("--name", default="fill")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--tasks", nargs="+", default=list(TASKS))
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", default="/tmp/fill_bench")
    args = ap.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = args.model
    if model is None:
        from mlxspec.engine.model.loader import resolve_model

        model = str(resolve_model(None).path)
    results: dict = {"model": model, "loadavg_start": os.getloadavg(), "levels": {}}
    out = HERE / "results" / f"{args.name}.json"
    procs, bases = [], {}
    try:
        for fill in ("off", "strict"):  # both up at once: each pair of levels runs back to back
            port = free_port()
            cmd = [sys.executable, "-m", "mlxspec", "serve", model, "--port", str(port)]
            cmd += ["--log-level", "warning", "--fill", fill]
            with open(work / f"{fill}.log", "w") as log:
                env = {**os.environ, "HF_HUB_OFFLINE": "1"}
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env))
            bases[fill] = f"http://127.0.0.1:{port}"
        for fill, proc in zip(bases, procs, strict=True):
            wait_healthy(bases[fill], 600, proc)
            results["levels"][fill] = []
        for task in args.tasks:
            for conc in args.concurrency:
                for repeat in range(args.repeats):
                    for fill, base in bases.items():
                        row = asyncio.run(level(base, task, conc, args.max_tokens))
                        row.update(repeat=repeat, loadavg=os.getloadavg()[0])
                        results["levels"][fill].append(row)
                        shown = {k: v for k, v in row.items() if k != "answers"}
                        print(fill, json.dumps(shown), flush=True)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(30)
    off, strict = results["levels"]["off"], results["levels"]["strict"]
    results["same_answers"] = all(
        a["answers"] == b["answers"] for a, b in zip(off, strict, strict=True)
    )
    results["speedup"] = {
        f"{a['task']} c={a['concurrency']} #{a['repeat']}": round(b["tok_s"] / a["tok_s"], 3)
        for a, b in zip(off, strict, strict=True)
    }
    results["loadavg_end"] = os.getloadavg()
    out.write_text(json.dumps(results, indent=1))
    print(json.dumps({"same_answers": results["same_answers"], "speedup": results["speedup"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

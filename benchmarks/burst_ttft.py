"""Per-round TTFT of bursts of concurrent streamed chats (a load for profiling).

Sends ``rounds`` bursts of 8 concurrent streaming chat requests (~120-token
prompts, ``max_tokens`` 128, greedy, the given ``logit_bias`` to forbid EOS) and
prints each request's time to its first non-empty content delta, per round. Used
with py-spy on the H200 (``benchmarks/h200.sh profile``): the first rounds show
first-use costs, later ones the steady state. Run by hand, never in CI:

    python benchmarks/burst_ttft.py http://127.0.0.1:8080 '{"2": -100}' 40
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx


async def one(client: httpx.AsyncClient, base: str, i: int, bias: dict, t0: float) -> float:
    words = " ".join(f"w{(j * 7 + i) % 50}" for j in range(60))
    body = {
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 128,
        "stream": True,
        "temperature": 0,
        "logit_bias": bias,
    }
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                return time.perf_counter() - t0
    return -1.0


async def main(base: str, bias: dict, rounds: int, width: int = 8) -> None:
    limits = httpx.Limits(max_connections=4 * width)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for rnd in range(rounds):
            t0 = time.perf_counter()
            got = await asyncio.gather(
                *(one(client, base, i + rnd * width, bias, t0) for i in range(width))
            )
            wall = (time.perf_counter() - t0) * 1000
            ttfts = [round(g * 1000) for g in sorted(got)]
            print(f"round {rnd} TTFT ms {ttfts} wall {wall:.0f}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])))

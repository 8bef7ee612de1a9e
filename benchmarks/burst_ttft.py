"""Per-round TTFT of bursts of concurrent streamed chats (a load for profiling).

Sends ``rounds`` bursts of 8 concurrent streaming chat requests (~120-token
prompts, ``max_tokens`` 128, greedy, the given ``logit_bias`` to forbid EOS) and
prints each request's time to its first non-empty content delta, per round. Used
with py-spy on the H200 (``benchmarks/h200.sh profile``): the first rounds show
first-use costs, later ones the steady state. With ``full`` as a fourth
argument each stream is read to its end (sustained batched decode, for profiling
the decode step) and each round also prints its aggregate output tokens/s. Run by
hand, never in CI:

    python benchmarks/burst_ttft.py http://127.0.0.1:8080 '{"2": -100}' 40 [full]
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx


async def one(
    client: httpx.AsyncClient, base: str, i: int, bias: dict, t0: float, full: bool = False
) -> tuple[float, int]:
    """One streamed chat: (seconds to its first content delta, content deltas read);
    without ``full`` the stream is closed at the first one."""
    words = " ".join(f"w{(j * 7 + i) % 50}" for j in range(60))
    body = {
        "messages": [{"role": "user", "content": words}],
        "max_tokens": 128,
        "stream": True,
        "temperature": 0,
        "logit_bias": bias,
    }
    first, deltas = -1.0, 0
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: ") and '"content":"' in line and '"content":""' not in line:
                deltas += 1
                if first < 0:
                    first = time.perf_counter() - t0
                if not full:
                    break
    return first, deltas


async def main(base: str, bias: dict, rounds: int, width: int = 8, full: bool = False) -> None:
    limits = httpx.Limits(max_connections=4 * width)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        for rnd in range(rounds):
            t0 = time.perf_counter()
            got = await asyncio.gather(
                *(one(client, base, i + rnd * width, bias, t0, full) for i in range(width))
            )
            wall = time.perf_counter() - t0
            ttfts = [round(g[0] * 1000) for g in sorted(got)]
            rate = f" {sum(g[1] for g in got) / wall:.0f} deltas/s" if full else ""
            print(f"round {rnd} TTFT ms {ttfts} wall {wall * 1000:.0f}{rate}", flush=True)


if __name__ == "__main__":
    full = sys.argv[4:] == ["full"]
    asyncio.run(main(sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), full=full))

"""Waves of streamed chats that start together, as serve_bench's levels do:
each round sends N requests at once (distinct ~128-token prompts, 128 tokens,
a ``logit_bias`` that keeps EOS away) and prints the time to first content
token (min, p50, max) and the round's wall time. Run by hand beside a profiler:

    python benchmarks/wave_burst.py http://127.0.0.1:8999 64 6

Arguments: the server's base URL, N (streams per wave), rounds.
"""

from __future__ import annotations

import asyncio
import sys
import time

import httpx

WORDS = " ".join(f"word{i}" for i in range(60))


async def one(client: httpx.AsyncClient, base: str, i: int, t0: float) -> tuple[float, float]:
    """One streamed chat: (seconds to its first content token, to its end), from ``t0``."""
    body = {"model": "m", "messages": [{"role": "user", "content": f"{i} {WORDS}"}],
            "max_tokens": 128, "stream": True, "logit_bias": {"65": 100}}  # fmt: skip
    first = None
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if first is None and '"delta":{"content"' in line:
                first = time.perf_counter() - t0
    assert first is not None, "no content came"
    return first, time.perf_counter() - t0


async def main(base: str, n: int, rounds: int) -> None:
    async with httpx.AsyncClient(timeout=300, limits=httpx.Limits(max_connections=4 * n)) as c:
        for r in range(rounds):
            t0 = time.perf_counter()
            res = await asyncio.gather(*(one(c, base, i + 1000 * r, t0) for i in range(n)))
            f = sorted(x[0] for x in res)
            wall = max(x[1] for x in res)
            print(f"round {r}: ttft min {f[0] * 1e3:.0f} p50 {f[len(f) // 2] * 1e3:.0f} "
                  f"max {f[-1] * 1e3:.0f} ms; wall {wall * 1e3:.0f} ms", flush=True)  # fmt: skip


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))

"""Where a prompt-cache hit's time goes, per lane, on the engine (no HTTP).

Runs the same scenarios on an engine with the prompt cache and one without
(``--prompt-cache-bytes 0``), each request streamed to its first token and on
to its end, and reports TTFT plus the time spent in each step of the hit path,
measured by timing wrappers around the engine thread's calls:

- ``fetch``: :meth:`PromptCache.fetch` (lookup, copy, trim).
- ``store``: :meth:`PromptCache.store` (compaction, evaluation, keeping).
- ``insert``: ``BatchGenerator.insert`` (batched lane).
- ``first_next``: the first ``BatchGenerator.next`` after an insert (prefill
  of the uncached tail, merge of the cache into the batch).

Scenarios, each run ``--repeats`` times (the first is a warm-up for MLX):

- ``miss``: a fresh ~``--prompt-tokens`` prompt (only the template is shared).
- ``extend``: the previous prompt plus its answer plus a follow-up (a later
  turn of a conversation: nearly all of it cached).

Run by hand, never in CI:

    python benchmarks/hit_path.py --prompt-tokens 1000 --max-tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from benchmarks.serve_bench import build_prompt  # noqa: E402

TIMES: dict[str, list[float]] = defaultdict(list)


def _timed(name, fn):
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            TIMES[name].append(time.perf_counter() - t0)

    return wrapper


def instrument() -> None:
    """Wrap the hit path's calls with timers (this script only)."""
    from mlx_lm.generate import BatchGenerator

    from mlxspec.engine.caches.prompt_cache import PromptCache

    PromptCache.fetch = _timed("fetch", PromptCache.fetch)
    PromptCache.store = _timed("store", PromptCache.store)
    BatchGenerator.insert = _timed("insert", BatchGenerator.insert)
    plain_next = BatchGenerator.next

    def next_(self):
        t0 = time.perf_counter()
        out = plain_next(self)
        if getattr(self, "_mlxspec_fresh", True):
            TIMES["first_next"].append(time.perf_counter() - t0)
            self._mlxspec_fresh = False
        return out

    plain_insert = BatchGenerator.insert

    def insert(self, *a, **k):
        self._mlxspec_fresh = True
        return plain_insert(self, *a, **k)

    BatchGenerator.next = next_
    BatchGenerator.insert = insert


async def one(engine, prompt, max_tokens, bias):
    """Submit ``prompt``; returns TTFT (s), total seconds, cached tokens, token ids."""
    from mlxspec.engine import Delta, Finished, GenerationRequest, LogitsParams

    req = GenerationRequest(
        tuple(prompt), max_tokens=max_tokens, logits=LogitsParams(logit_bias=bias)
    )
    t0 = time.perf_counter()
    first, ids, fin = None, [], None
    async for ev in engine.submit(req):
        if isinstance(ev, Delta):
            first = first or time.perf_counter()
            ids += ev.token_ids
        elif isinstance(ev, Finished):
            fin = ev
    end = time.perf_counter()
    return (first or end) - t0, end - t0, fin.cached_tokens, ids


def scenario(engine, tok, args, salt, bias) -> list[dict]:
    """One conversation: a fresh prompt, then ``--turns`` extensions of it."""
    rows = []
    msgs = [{"role": "user", "content": build_prompt(tok, args.prompt_tokens, salt)}]
    for turn in range(args.turns + 1):
        prompt = engine.chat_prompt(msgs)
        TIMES.clear()
        ttft, total, cached, ids = asyncio.run(one(engine, prompt, args.max_tokens, bias))
        rows.append(
            {
                "turn": turn,
                "prompt": len(prompt),
                "cached": cached,
                "ttft": ttft,
                "total": total,
                **{k: sum(v) for k, v in TIMES.items()},
            }
        )
        msgs += [
            {"role": "assistant", "content": tok.decode(ids)},
            {"role": "user", "content": "And then? Say more about it."},
        ]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="MLX model folder (default: the embedded SmolLM2)")
    ap.add_argument("--prompt-tokens", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--turns", type=int, default=2, help="extensions after the first prompt")
    ap.add_argument("--repeats", type=int, default=2, help="conversations per engine")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)

    from mlxspec.engine import Engine
    from mlxspec.engine.model.loader import resolve_model

    path = Path(args.model) if args.model else resolve_model(None).path
    instrument()
    report = []
    for batch in args.batch:
        for budget in (1 << 30, 0):
            engine = Engine.load(path, "bench", max_batch=batch, prompt_cache_bytes=budget)
            engine.start()
            tok = engine.tokenizer
            bias = tuple((t, -1e9) for t in tok.eos_token_ids)
            try:
                for rep in range(args.repeats):
                    for row in scenario(engine, tok, args, 100 + rep, bias):
                        row.update(batch=batch, cache=budget > 0, rep=rep)
                        report.append(row)
                        print(
                            " ".join(
                                f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                for k, v in row.items()
                            ),
                            flush=True,
                        )
            finally:
                engine.close()
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

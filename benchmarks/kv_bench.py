"""KV cache quantisation (issue 28 item 3): bytes per token, context in one
``--kv-budget`` and decode speed at N rows, for bf16, kv8 and kv4.

In process, on the engine (no HTTP): for each scheme an ``Engine`` is loaded with
``--kv-budget`` and the scheme; its admission room is the context that budget
holds; ``rows`` greedy requests of ``--prompt-tokens`` prompt tokens (EOS
forbidden) then run at once, and the decode rate is the generated tokens after
every row's first one over the time from the last first token to the end. The
bytes per token are read twice: from the scheme (what admission counts) and from
the prompt-cache entry the run leaves (the real arrays). Schemes alternate for
``--repeats`` rounds; each rate is the median.

    python benchmarks/kv_bench.py --name cpu-kv --rows 8 --prompt-tokens 512 --max-tokens 48
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

RESULTS = Path(__file__).resolve().parent / "results"


def _load(model: Path, mode: str, budget: int, rows: int):
    from mlxspec.engine import AdmissionLimits, Engine, KvOptions

    engine = Engine.load(
        model,
        "bench",
        max_batch=rows,
        kv=KvOptions(mode),
        limits=AdmissionLimits(kv_budget=budget),
        warmup=False,
    )
    engine.start()
    return engine


async def _one(engine, request, firsts: list[float]) -> int:
    from mlxspec.engine import Delta

    n = 0
    async for event in engine.submit(request):
        if isinstance(event, Delta) and event.token_ids:
            if n == 0:
                firsts.append(time.perf_counter())
            n += len(event.token_ids)
    return n


def _decode_rate(engine, rows: int, prompt_tokens: int, max_tokens: int, seed: int) -> float:
    from mlxspec.engine import GenerationRequest, LogitsParams

    eos = tuple((int(t), -100.0) for t in sorted(engine.tokenizer.eos_token_ids))
    vocab = len(engine.tokenizer.vocab) if hasattr(engine.tokenizer, "vocab") else 32000
    requests = []
    for r in range(rows):  # distinct prompts: no prompt-cache hits between rows
        ids = [
            (seed * 7919 + r * 104729 + i * 31) % (vocab - 100) + 50 for i in range(prompt_tokens)
        ]
        requests.append(
            GenerationRequest(
                tuple(ids), max_tokens=max_tokens, logits=LogitsParams(logit_bias=eos)
            )
        )
    firsts: list[float] = []

    async def go():
        return await asyncio.gather(*(_one(engine, q, firsts) for q in requests))

    counts = asyncio.run(go())
    end = time.perf_counter()
    return (sum(counts) - rows) / max(1e-9, end - max(firsts))


def _measured_bytes(engine) -> float:
    """KV bytes per token of the longest prompt-cache entry (its real arrays)."""
    best = max(engine.prompt_cache._entries.items(), key=lambda kv: len(kv[0][1]))
    return best[1].nbytes / len(best[0][1])


def main(argv: list[str] | None = None) -> int:
    from mlxspec.engine.model.loader import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="default: the embedded model")
    ap.add_argument("--name", default="cpu-kv")
    ap.add_argument("--modes", nargs="+", default=["bf16", "kv8", "kv4"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--kv-budget", type=int, default=256 << 20)
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)
    model = args.model or resolve_model(None).path
    out: dict = {
        "name": args.name,
        "model": str(model),
        "rows": args.rows,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "kv_budget_bytes": args.kv_budget,
        "load_avg_start": os.getloadavg(),
        "modes": {},
    }
    rates: dict[str, list[float]] = {m: [] for m in args.modes}
    for rep in range(args.repeats):
        order = args.modes if rep % 2 == 0 else list(reversed(args.modes))
        for mode in order:
            engine = _load(model, mode, args.kv_budget, args.rows)
            try:
                rate = _decode_rate(engine, args.rows, args.prompt_tokens, args.max_tokens, rep)
                rates[mode].append(rate)
                fit = engine.fit_snapshot()
                out["modes"][mode] = {
                    "bytes_per_token": fit.memory.kv_bytes_per_token,
                    "measured_bytes_per_token": round(_measured_bytes(engine), 1),
                    "kv_dtype": fit.memory.kv_dtype,
                    "context_in_budget": engine.admission.kv_room,
                    "kv_quant": fit.kv_quant,
                }
            finally:
                engine.close()
            print(f"{mode} round {rep}: {rate:.1f} tok/s", flush=True)
    base = out["modes"].get("bf16")
    for mode, row in out["modes"].items():
        row["decode_tps"] = [round(r, 2) for r in rates[mode]]
        row["decode_tps_median"] = round(statistics.median(rates[mode]), 2)
        if base is not None:
            row["context_vs_bf16"] = round(row["context_in_budget"] / base["context_in_budget"], 2)
            row["bytes_vs_bf16"] = round(base["bytes_per_token"] / row["bytes_per_token"], 2)
            med = statistics.median(rates["bf16"])
            row["decode_vs_bf16"] = round(row["decode_tps_median"] / med, 3)
    out["load_avg_end"] = os.getloadavg()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{args.name}.json"
    path.write_text(json.dumps(out, indent=2))
    _plot(out, path.with_suffix(".png"))
    print(
        json.dumps(
            {m: {k: v for k, v in r.items() if k != "kv_quant"} for m, r in out["modes"].items()},
            indent=1,
        )
    )
    return 0


def _plot(out: dict, path: Path) -> None:
    """Two bar groups (context in the budget, decode tok/s) with Pillow."""
    from PIL import Image, ImageDraw

    modes = list(out["modes"])
    panels = [
        ("context in budget (tokens)", "context_in_budget"),
        ("decode tok/s", "decode_tps_median"),
    ]
    img = Image.new("RGB", (720, 360), "white")
    draw = ImageDraw.Draw(img)
    draw.text(
        (10, 5), f"{out['name']}: {out['rows']} rows, prompt {out['prompt_tokens']}", fill="black"
    )
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52"]
    for p, (title, key) in enumerate(panels):
        x0 = 20 + p * 350
        draw.text((x0, 30), title, fill="black")
        top = max(out["modes"][m][key] for m in modes) or 1
        for i, mode in enumerate(modes):
            value = out["modes"][mode][key]
            h = int(250 * value / top)
            x = x0 + 20 + i * 100
            draw.rectangle([x, 320 - h, x + 60, 320], fill=colours[i % len(colours)])
            draw.text((x, 325), mode, fill="black")
            draw.text((x, 305 - h), f"{value:g}", fill="black")
    img.save(path)


if __name__ == "__main__":
    raise SystemExit(main())

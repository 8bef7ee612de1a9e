"""Where single-stream decode time goes: mlx-lm alone vs the mlxspec engine, no HTTP.

Decodes one greedy stream of ``--max-tokens`` tokens after a fixed prompt and
reports tokens/s for each layer, so the server's per-token overhead can be
split into engine and HTTP parts (``serve_bench.py`` measures the HTTP total):

- ``generate_step``: mlx-lm's decode loop, tokens only.
- ``stream_generate``: mlx-lm's loop plus its streaming detokenizer (the
  issue's 90% anchor).
- ``batch_generator``: mlx-lm's ``BatchGenerator`` with one row.
- ``engine_serial`` / ``engine_batched``: mlxspec's ``Engine`` (``--batch 1``
  and ``--batch 8`` with one request), events consumed on an asyncio loop.

EOS is forbidden with a logit bias so every run decodes the same length.
Writes ``benchmarks/results/<name>.json``. Run by hand, never in CI:

    python benchmarks/overhead.py --model /tmp/rand8b --name h200-llama8b-overhead
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def _no_eos(eos: list[int]):
    import mlx.core as mx

    def processor(_tokens, logits):
        return logits.at[..., mx.array(eos)].add(-1e9)

    return processor


def time_generate_step(model, prompt, n, eos) -> float:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    start, count = None, 0
    for _tok, _ in generate_step(
        mx.array(prompt), model, max_tokens=n, logits_processors=[_no_eos(eos)]
    ):
        count += 1
        if start is None:
            start = time.perf_counter()
    return (count - 1) / (time.perf_counter() - start)


def time_stream_generate(model, tokenizer, prompt, n, eos) -> float:
    from mlx_lm import stream_generate

    last = None
    for resp in stream_generate(
        model, tokenizer, prompt, max_tokens=n, logits_processors=[_no_eos(eos)]
    ):
        last = resp
    return last.generation_tps


def time_batch_generator(model, prompt, n, eos) -> float:
    from mlx_lm.generate import BatchGenerator

    gen = BatchGenerator(model, completion_batch_size=8)
    gen.insert([prompt], max_tokens=[n], logits_processors=[[_no_eos(eos)]])
    start, count = None, 0
    for _ in range(10 * n + 100):  # prefill steps return no tokens
        _, responses = gen.next()
        for r in responses:
            count += 1
            if start is None:
                start = time.perf_counter()
            if r.finish_reason is not None:
                gen.close()
                return (count - 1) / (time.perf_counter() - start)
    return (count - 1) / (time.perf_counter() - start)


async def _engine_run(engine, prompt, n, eos) -> float:
    from mlxspec.engine import Delta, Finished, GenerationRequest, LogitsParams

    req = GenerationRequest(
        prompt=tuple(prompt),
        max_tokens=n,
        logits=LogitsParams(logit_bias=tuple((e, -1e9) for e in eos)),
    )
    handle = engine.submit(req)
    # A Delta is sent only for tokens that complete text, so count from Finished.
    start = None
    async for event in handle:
        if isinstance(event, Delta) and start is None:
            start = time.perf_counter()
        elif isinstance(event, Finished):
            return (event.completion_tokens - 1) / (time.perf_counter() - start)
    raise RuntimeError("request did not finish")


def time_engine(path, prompt, n, eos, batch) -> float:
    from mlxspec.engine import Engine

    engine = Engine.load(Path(path), "bench", max_batch=batch)
    engine.start()
    try:
        asyncio.run(_engine_run(engine, prompt, 8, eos))  # warm up
        return asyncio.run(_engine_run(engine, prompt, n, eos))
    finally:
        engine.close()


def plot(result: dict, dest: Path) -> None:
    """Bar chart of tokens/s per layer, written to ``dest`` (PNG; needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(result["tokens_per_s"])
    values = [result["tokens_per_s"][k] for k in labels]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    bars = ax.bar(labels, values, color="#4c72b0")
    for bar, label in zip(bars, labels, strict=True):
        ratio = result["ratio_to_stream_generate"][label]
        ax.annotate(
            f"x{ratio:.2f}",
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=8,
        )
    ax.set_ylabel("decode tokens/s (one stream)")
    ax.set_title(f"{result['name']}: {result['device']}", fontsize=9)
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(dest, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replot", type=Path, help="only redraw the PNG of a results JSON")
    parser.add_argument("--model")
    parser.add_argument("--name")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--switch-interval", type=float, default=None, help="sys.setswitchinterval (s)"
    )
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.replot.with_suffix(".png"))
        return
    if not (args.model and args.name):
        parser.error("--model and --name are required")
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)

    import mlx.core as mx
    from mlx_lm import load

    model, tokenizer = load(args.model)
    eos = sorted(tokenizer.eos_token_ids)
    prompt = (tokenizer.encode("The quick brown fox jumps over the lazy dog. ") * 64)[
        : args.prompt_tokens
    ]
    n = args.max_tokens
    runs = {
        "generate_step": lambda: time_generate_step(model, prompt, n, eos),
        "stream_generate": lambda: time_stream_generate(model, tokenizer, prompt, n, eos),
        "batch_generator": lambda: time_batch_generator(model, prompt, n, eos),
        "engine_serial": lambda: time_engine(args.model, prompt, n, eos, 1),
        "engine_batched": lambda: time_engine(args.model, prompt, n, eos, 8),
    }
    time_generate_step(model, prompt, 16, eos)  # compile / warm caches
    results = {}
    for label, fn in runs.items():
        rates = [fn() for _ in range(args.repeats)]
        results[label] = max(rates)
        print(
            f"{label:16s} {results[label]:8.1f} tok/s  "
            f"(runs: {', '.join(f'{r:.1f}' for r in rates)})"
        )
    anchor = results["stream_generate"]
    ratios = {k: round(v / anchor, 3) for k, v in results.items()}
    print("ratio to stream_generate:", ratios)
    out = {
        "name": args.name,
        "model": args.model,
        "device": str(mx.default_device()),
        "platform": platform.platform(),
        "max_tokens": n,
        "switch_interval": sys.getswitchinterval(),
        "prompt_tokens": len(prompt),
        "tokens_per_s": results,
        "ratio_to_stream_generate": ratios,
    }
    dest = HERE / "results" / f"{args.name}.json"
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print("wrote", dest)
    try:
        plot(out, dest.with_suffix(".png"))
    except ImportError:
        print("matplotlib missing: no plot")


if __name__ == "__main__":
    main()

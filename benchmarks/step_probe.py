"""Where a batched decode step's time goes: the model's forward at batch B with
mlx-lm's plain ``KVCache`` against its ``BatchKVCache`` and ``BatchGenerator``,
pipelined and synchronous, plus the matrix products of one layer alone.

Issue #6's c=8 target needs decode steps at eight rows to cost less than they
do in ``BatchGenerator``; this says whether the extra time over one row sits in
the GPU's kernels (matrix products at M = B, masked attention) or on the host
(graph building, per-row Python). Run by hand on the H200, never in CI:

    python benchmarks/step_probe.py --model DIR --batches 1 8 --steps 64 --json OUT.json
    python benchmarks/step_probe.py --plot OUT.png RESULT.json [RESULT.json ...]

Per batch size B (prompts of ``--prompt`` random tokens, greedy, ``--steps``
decode steps after a warm-up), milliseconds per step:

- ``plain``: ``make_prompt_cache`` caches, the loop of mlx-lm's
  ``generate_step`` (the next step's graph is built and queued with
  ``mx.async_eval`` before the current token is read);
- ``plain_sync``: the same, each step evaluated before the next is built (host
  graph building plus GPU time, not overlapped);
- ``build``: host time to build one step's graph alone (no evaluation);
- ``batchkv``: ``BatchKVCache`` caches (no left padding), pipelined as ``plain``:
  the attention mask and cache layout ``BatchGenerator`` uses;
- ``batchgen``: ``BatchGenerator.next()`` with B rows, one shared greedy sampler;
- ``batchgen_bias``: the same with a ``logit_bias`` processor on each row, as
  serve_bench's requests carry (EOS forbidden) and both servers then run: each
  row's logits are processed alone and the rows concatenated;
- ``matmul``: one layer's matrix products at M = B rows (µs), times the layers.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def _greedy(logits):
    import mlx.core as mx

    return mx.argmax(logits[:, -1, :], axis=-1).astype(mx.uint32)


def _prefill(model, cache, prompts):
    import mlx.core as mx

    model(prompts[:, :-1], cache=cache)
    mx.eval([c.state for c in cache])
    return prompts[:, -1]


def time_loop(model, cache, y, steps: int, pipelined: bool) -> float:
    """Milliseconds per decode step over ``steps`` steps from token ids ``y``
    (shape (B,)), the KV cache ``cache`` already holding the prompts."""
    import mlx.core as mx

    def step(tokens):
        return _greedy(model(tokens[:, None], cache=cache))

    nxt = step(y)
    mx.async_eval(nxt)
    start = time.perf_counter()
    for _ in range(steps):
        cur = nxt
        if pipelined:
            nxt = step(cur)
            mx.async_eval(nxt)
            cur.tolist()
        else:
            cur.tolist()
            nxt = step(cur)
            mx.eval(nxt)
    nxt.tolist()
    return (time.perf_counter() - start) / steps * 1e3


def time_build(model, cache, y, steps: int) -> float:
    """Host milliseconds to build one decode step's graph (not evaluated; the
    cache's offsets move, so the graphs are thrown away)."""
    import mlx.core as mx

    times = []
    for _ in range(steps):
        state = [(c.offset, c.keys, c.values) for c in cache]
        start = time.perf_counter()
        _greedy(model(y[:, None], cache=cache))
        times.append(time.perf_counter() - start)
        for c, (offset, k, v) in zip(cache, state, strict=True):
            c.offset, c.keys, c.values = offset, k, v
    mx.synchronize()
    return statistics.median(times) * 1e3


def time_batchgen(model, prompts, steps: int, bias: dict[int, float] | None = None) -> float:
    """Milliseconds per ``BatchGenerator.next()`` once every row decodes; with
    ``bias`` (token id -> additive logit), each row gets its own mlx-lm
    ``logit_bias`` processor."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    sampler = make_sampler(temp=0.0)
    rows = prompts.tolist()
    gen = BatchGenerator(
        model,
        stop_tokens=[],
        completion_batch_size=len(rows),
        prefill_batch_size=min(len(rows), 8),
        prefill_step_size=512,
    )
    processors = [make_logits_processors(bias) if bias else [] for _ in rows]
    gen.insert(
        rows,
        max_tokens=[steps + 64] * len(rows),
        samplers=[sampler] * len(rows),
        logits_processors=processors,
    )
    while True:  # prefill and the first tokens
        _, responses = gen.next()
        if len(responses) == len(rows):
            break
    for _ in range(8):
        gen.next()
    start = time.perf_counter()
    for _ in range(steps):
        gen.next()
    elapsed = time.perf_counter() - start
    gen.close()
    return elapsed / steps * 1e3


def time_matmuls(args_model, rows: int, dtype, repeats: int = 50) -> float:
    """Microseconds of one layer's seven matrix products at ``rows`` rows
    (bf16 weights of the model's shapes), measured over ``repeats`` layers."""
    import mlx.core as mx

    hidden = args_model.hidden_size
    inter = args_model.intermediate_size
    kv = args_model.num_key_value_heads * (hidden // args_model.num_attention_heads)
    shapes = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden)]
    shapes += [(inter, hidden), (inter, hidden), (hidden, inter)]
    weights = [[mx.random.normal(s).astype(dtype) for s in shapes] for _ in range(4)]
    x = mx.random.normal((rows, hidden)).astype(dtype)
    xi = mx.random.normal((rows, inter)).astype(dtype)
    mx.eval(weights, x, xi)

    def layer(w):
        outs = [x @ w[i].T for i in range(6)] + [xi @ w[6].T]
        return outs

    mx.eval([layer(w) for w in weights])
    start = time.perf_counter()
    outs = []
    for i in range(repeats):
        outs.append(layer(weights[i % 4]))
    mx.eval(outs)
    return (time.perf_counter() - start) / repeats * 1e6


#: The per-step layers drawn by :func:`plot`, in legend order.
LAYERS = ("plain", "batchkv", "batchgen", "batchgen_bias", "plain_sync", "matmul_model_ms")


def plot(results: list[Path], out: Path) -> None:
    """Milliseconds per decode step against the batch size, one panel per result
    file (median over its rounds), one line per layer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6 * len(results), 4), squeeze=False)
    for ax, path in zip(axes[0], results, strict=True):
        runs = json.loads(path.read_text())["runs"]
        batches = sorted({r["batch"] for r in runs})
        for layer in LAYERS:
            if any(layer not in r for r in runs):  # results from before the layer existed
                continue
            ms = [statistics.median(r[layer] for r in runs if r["batch"] == b) for b in batches]
            ax.plot(batches, ms, marker="o", label=layer)
        ax.set_title(path.stem)
        ax.set_xlabel("rows decoding at once")
        ax.set_ylabel("ms per decode step (median of rounds)")
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path, nargs="*", help="result files to --plot")
    ap.add_argument("--plot", type=Path, help="draw RESULTS into this PNG and stop")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.plot:
        plot(args.results, args.plot)
        return
    if args.model is None:
        ap.error("--model is required to measure")

    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

    model, tokenizer = load(str(args.model))
    forbid_eos = {int(t): -1e9 for t in tokenizer.eos_token_ids}
    vocab = model.args.vocab_size
    n_layers = model.args.num_hidden_layers
    results: dict = {"model": str(args.model), "device": str(mx.default_device()), "runs": []}
    for rnd in range(args.rounds):
        for b in args.batches:
            mx.random.seed(b)
            prompts = mx.random.randint(3, vocab, (b, args.prompt)).astype(mx.uint32)
            row: dict = {"round": rnd, "batch": b}
            for name, pipelined in (("plain", True), ("plain_sync", False)):
                cache = make_prompt_cache(model)
                y = _prefill(model, cache, prompts)
                row[name] = time_loop(model, cache, y, args.steps, pipelined)
            cache = make_prompt_cache(model)
            y = _prefill(model, cache, prompts)
            row["build"] = time_build(model, cache, y, 16)
            cache = [BatchKVCache([0] * b) for _ in model.layers]
            y = _prefill(model, cache, prompts)
            row["batchkv"] = time_loop(model, cache, y, args.steps, True)
            row["batchgen"] = time_batchgen(model, prompts, args.steps)
            row["batchgen_bias"] = time_batchgen(model, prompts, args.steps, forbid_eos)
            row["matmul_layer_us"] = time_matmuls(model.args, b, mx.bfloat16)
            row["matmul_model_ms"] = row["matmul_layer_us"] * n_layers / 1e3
            results["runs"].append(row)
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
            print(json.dumps(shown), flush=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

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
- ``decode``: mlxspec's own step (``engine/loop/decode.py``, ``DecodeBatch``)
  with B greedy rows, its tokens read and dropped; ``decode_bias`` with a
  ``logit_bias`` on every row (one bias matrix); ``decode_routed`` the same
  with each token handed to a real ``Row`` (detokenizer, stop strings, events),
  as the server routes it. ``decode_build_ms`` / ``decode_read_ms``: host time
  per step building and queueing the step, and waiting for its tokens (the one
  sync); the rest of a step is GPU time the host overlapped.

The profile of one decode step at B rows (milliseconds per step, each kernel
family timed alone over the model's layers): ``attn_ms`` and ``attn_mask_ms``
(``mx.fast.scaled_dot_product_attention`` at the probe's mean context, without
and with ``BatchKVCache``'s left-padding mask), ``norm_ms`` (the RMS norms),
``lm_head_ms`` (the output projection), ``logits_ms`` (the batch's logits
processors: the bias matrix), ``sample_ms`` (log-softmax and greedy argmax over
``(B, vocab)``) and ``sample_top_p_ms`` (the sampled path with top-p); on
CUDA also ``attn_rows_ms``, the padded-row attention kernel
(``engine/caches/rows_attention.py``) on the masked case's rows.
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


def _row(tokenizer, prompt: list[int], max_tokens: int, bias: dict[int, float] | None, loop):
    """A request's Handoff for the decode step (a Row on a never-run loop)."""
    from mlxspec.engine.loop.handles import RequestHandle
    from mlxspec.engine.loop.lanes import Handoff
    from mlxspec.engine.loop.rows import Row
    from mlxspec.engine.sampling.sampler import build_sampler
    from mlxspec.engine.types import GenerationRequest, LogitsParams

    logits = LogitsParams(logit_bias=tuple((bias or {}).items()))
    request = GenerationRequest(tuple(prompt), max_tokens=max_tokens, logits=logits)
    row = Row(RequestHandle(request, loop), tokenizer, frozenset(), lane="batched")
    return Handoff(
        row=row,
        feed=list(prompt),
        held=[],
        cache=None,
        max_tokens=max_tokens,
        sampler=build_sampler(request.sampling, []),
        processors=[],
    )


def time_decode(model, tokenizer, prompts, steps: int, bias=None, routed=False) -> dict:
    """Milliseconds per step of mlxspec's ``DecodeBatch`` once every row decodes,
    and its host time per step (building the step; waiting for the tokens)."""
    import asyncio

    import mlx.core as mx

    from mlxspec.engine.loop.decode import DecodeBatch

    loop = asyncio.new_event_loop()
    rows = prompts.tolist()
    batch = DecodeBatch(model, 512, len(rows), prefill_rows=min(len(rows), 8))
    for p in rows:
        batch.add(_row(tokenizer, p, steps + 64, bias, loop))

    def route(tokens) -> None:
        if routed:
            for t in tokens:
                t.slot.row.push(t.id, t.logprobs)

    while batch.clock.steps < 8 or any(not s.started for s in batch.slots):
        batch.step(route)
    mx.synchronize()
    clock0 = (batch.clock.build_s, batch.clock.read_s, batch.clock.steps)
    start = time.perf_counter()
    for _ in range(steps):
        batch.step(route)
    elapsed = time.perf_counter() - start
    n = batch.clock.steps - clock0[2]
    out = {
        "ms": elapsed / steps * 1e3,
        "build_ms": (batch.clock.build_s - clock0[0]) / n * 1e3,
        "read_ms": (batch.clock.read_s - clock0[1]) / n * 1e3,
    }
    batch.clear()
    loop.close()
    return out


def _per_call_ms(fn, repeats: int = 20) -> float:
    """Milliseconds per call of ``fn`` (which returns arrays), evaluated once
    the ``repeats`` calls are queued."""
    import mlx.core as mx

    mx.eval(fn())
    start = time.perf_counter()
    outs = [fn() for _ in range(repeats)]
    mx.eval(outs)
    return (time.perf_counter() - start) / repeats * 1e3


def profile_step(args_model, rows: int, context: int, dtype) -> dict:
    """Each kernel family of one decode step at ``rows`` rows, timed alone
    (milliseconds per step: per-layer kernels times the layers)."""
    import mlx.core as mx

    from mlxspec.engine.sampling.batch_logits import BatchLogits
    from mlxspec.engine.sampling.batch_sampler import BatchSampler, RowSampling
    from mlxspec.engine.types import LogitsParams

    layers = args_model.num_hidden_layers
    hidden, vocab = args_model.hidden_size, args_model.vocab_size
    heads, kv = args_model.num_attention_heads, args_model.num_key_value_heads
    dim = hidden // heads
    q = mx.random.normal((rows, heads, 1, dim)).astype(dtype)
    k = mx.random.normal((rows, kv, context, dim)).astype(dtype)
    v = mx.random.normal((rows, kv, context, dim)).astype(dtype)
    pads = mx.array([i % 16 for i in range(rows)])
    mask = (mx.arange(context)[None] >= pads[:, None])[:, None, None, :]
    scale = dim**-0.5
    x = mx.random.normal((rows, 1, hidden)).astype(dtype)
    w = mx.ones((hidden,), dtype=dtype)
    head = mx.random.normal((vocab, hidden)).astype(dtype) * 0.02
    logits = mx.random.normal((rows, vocab)).astype(dtype)
    mx.eval(q, k, v, mask, x, w, head, logits)

    def sdpa(m):
        return lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=m)

    proc = BatchLogits()
    proc.extend(
        [LogitsParams(logit_bias=((0, -1e9), (2, -1e9)))] * rows, [[]] * rows, [None] * rows
    )
    greedy = BatchSampler()
    greedy.extend([RowSampling(0.0, 1.0, 0.0, 0)] * rows)
    top_p = BatchSampler()
    top_p.extend([RowSampling(0.8, 0.9, 0.0, 0)] * rows)

    def sample(sampler):
        def run():
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            return sampler(lp)

        return run

    from mlxspec.engine.caches import rows_attention

    rows_ms = {}
    if rows_attention.available():  # the padded-row kernel on the same rows (CUDA)
        starts = pads.astype(mx.int32)
        rows_ms["attn_rows_ms"] = layers * _per_call_ms(
            lambda: rows_attention.rows_attention(q, k, v, starts, context, scale)
        )
    return {
        **rows_ms,
        "attn_ms": _per_call_ms(sdpa(None)) * layers,
        "attn_mask_ms": _per_call_ms(sdpa(mask)) * layers,
        "norm_ms": _per_call_ms(lambda: mx.fast.rms_norm(x, w, 1e-5)) * (2 * layers + 1),
        "lm_head_ms": _per_call_ms(lambda: x @ head.T),
        "logits_ms": _per_call_ms(lambda: proc(logits, mx.zeros((rows,), dtype=mx.uint32))),
        "sample_ms": _per_call_ms(sample(greedy)),
        "sample_top_p_ms": _per_call_ms(sample(top_p)),
    }


#: The per-step layers drawn by :func:`plot`, in legend order.
LAYERS = (
    "plain",
    "batchkv",
    "batchgen",
    "batchgen_bias",
    "decode",
    "decode_bias",
    "decode_routed",
    "plain_sync",
    "matmul_model_ms",
)


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


#: What :func:`measure` can time (``--only`` picks some).
MEASURED = (
    "plain",
    "plain_sync",
    "build",
    "batchkv",
    "batchgen",
    "batchgen_bias",
    "decode",
    "decode_bias",
    "decode_routed",
    "profile",
    "matmul",
)


def measure(model, tokenizer, prompts, args, want: set[str], forbid_eos: dict) -> dict:
    """One batch size's measurements (the layers in ``want``)."""
    import mlx.core as mx
    from mlx_lm.models.cache import BatchKVCache, make_prompt_cache

    b = prompts.shape[0]
    row: dict = {}
    for name, pipelined in (("plain", True), ("plain_sync", False)):
        if name in want:
            cache = make_prompt_cache(model)
            y = _prefill(model, cache, prompts)
            row[name] = time_loop(model, cache, y, args.steps, pipelined)
    if "build" in want:
        cache = make_prompt_cache(model)
        y = _prefill(model, cache, prompts)
        row["build"] = time_build(model, cache, y, 16)
    if "batchkv" in want:
        cache = [BatchKVCache([0] * b) for _ in model.layers]
        y = _prefill(model, cache, prompts)
        row["batchkv"] = time_loop(model, cache, y, args.steps, True)
    if "batchgen" in want:
        row["batchgen"] = time_batchgen(model, prompts, args.steps)
    if "batchgen_bias" in want:
        row["batchgen_bias"] = time_batchgen(model, prompts, args.steps, forbid_eos)
    for name, kw in (
        ("decode", {}),
        ("decode_bias", {"bias": forbid_eos}),
        ("decode_routed", {"bias": forbid_eos, "routed": True}),
    ):
        if name in want:
            got = time_decode(model, tokenizer, prompts, args.steps, **kw)
            row[name] = got["ms"]
            row[f"{name}_build_ms"], row[f"{name}_read_ms"] = got["build_ms"], got["read_ms"]
    if "profile" in want:
        context = args.prompt + args.steps // 2
        row.update(profile_step(model.args, b, context, mx.bfloat16))
    if "matmul" in want:
        row["matmul_layer_us"] = time_matmuls(model.args, b, mx.bfloat16)
        row["matmul_model_ms"] = row["matmul_layer_us"] * model.args.num_hidden_layers / 1e3
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path, nargs="*", help="result files to --plot")
    ap.add_argument("--plot", type=Path, help="draw RESULTS into this PNG and stop")
    ap.add_argument("--model", type=Path)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", nargs="*", choices=MEASURED, help="measure only these (default: all)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.plot:
        plot(args.results, args.plot)
        return
    if args.model is None:
        ap.error("--model is required to measure")

    import mlx.core as mx
    from mlx_lm import load

    model, tokenizer = load(str(args.model))
    forbid_eos = {int(t): -1e9 for t in tokenizer.eos_token_ids}
    vocab = model.args.vocab_size
    results: dict = {"model": str(args.model), "device": str(mx.default_device()), "runs": []}
    want = set(args.only or MEASURED)
    for rnd in range(args.rounds):
        for b in args.batches:
            mx.random.seed(b)
            prompts = mx.random.randint(3, vocab, (b, args.prompt)).astype(mx.uint32)
            row: dict = {"round": rnd, "batch": b}
            row.update(measure(model, tokenizer, prompts, args, want, forbid_eos))
            results["runs"].append(row)
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
            print(json.dumps(shown), flush=True)
            if args.json:  # after every row: a run cut off keeps what it measured
                args.json.parent.mkdir(parents=True, exist_ok=True)
                args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

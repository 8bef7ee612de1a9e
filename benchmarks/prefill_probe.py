"""How fast a model prefills a wave of joining rows, against what its matrix
products alone reach: is the end-to-end gap of issue 34 item 1 in our prefill
path or in MLX's kernels? Run by hand on a GPU, never in CI:

    python benchmarks/prefill_probe.py --model DIR --rows 1 8 32 64 --json OUT.json

Per row count B (prompts of ``--prompt`` random tokens), milliseconds per
prefill of all B rows (median of ``--repeats``, after one unmeasured warm-up of
the same shape):

- ``plain``: the model's forward at ``(B, prompt)`` into fresh
  ``make_prompt_cache`` caches, evaluated (mlx-lm's own prefill, batched);
- ``group``: mlxspec's :class:`~mlxspec.engine.loop.prefill.PrefillGroup` of B
  rows, chunked by ``--group-rows`` rows at a time as the server's
  ``--prompt-concurrency`` does (``mlxspec serve``'s default 8), each chunk
  evaluated: the server's prefill of a wave, less scheduling and HTTP;
- ``matmul``: the layer's seven matrix products at ``M = B x prompt`` rows,
  times the layers (the dense floor; attention, norms and the LM head excluded).

Reported beside each: prefill tokens per second, and TFLOP/s counted as
``2 x parameters x tokens`` (the usual dense-transformer estimate, Kaplan et al.
2020, section 2.1; attention's ``O(prompt^2)`` term is small at 128 tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path


def _median_ms(run, repeats: int) -> float:
    run()  # warm-up: kernels for the shape
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def _params(model) -> int:
    from mlx.utils import tree_flatten

    return sum(v.size for _, v in tree_flatten(model.parameters()))


def measure(model_dir: Path, rows: list[int], prompt: int, group_rows: int, repeats: int) -> dict:
    """The three timings for each row count (see the module docstring)."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    from mlxspec.engine.caches.kv_scheme import KvScheme
    from mlxspec.engine.loop.prefill import PrefillGroup, Slot

    model, _ = load(str(model_dir))
    params = _params(model)
    margs = model.args
    hidden, inter, layers = margs.hidden_size, margs.intermediate_size, margs.num_hidden_layers
    kv = margs.num_key_value_heads * (hidden // margs.num_attention_heads)
    shapes = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden)]
    shapes += [(inter, hidden), (inter, hidden), (hidden, inter)]
    dtype = model.model.embed_tokens.weight.dtype
    weights = [mx.random.normal(s).astype(dtype) for s in shapes]
    mx.eval(weights)
    out: dict = {"model": str(model_dir), "params": params, "prompt": prompt,
                 "group_rows": group_rows, "device": str(mx.default_device()),
                 "rows": {}}  # fmt: skip
    for b in rows:
        tokens = mx.random.randint(0, margs.vocab_size, (b, prompt)).astype(mx.uint32)
        mx.eval(tokens)

        def plain(tokens=tokens):
            cache = make_prompt_cache(model)
            model(tokens, cache=cache)
            mx.eval([c.state for c in cache])

        def group(tokens=tokens, b=b):
            scheme = KvScheme()
            for start in range(0, b, group_rows):
                part = tokens[start : start + group_rows].tolist()
                slots = [Slot(row=None, seq=[*p, 0], budget=1, sampling=None) for p in part]
                g = PrefillGroup(slots, model, prompt, scheme)
                while not g.done:
                    g.advance(lambda ids, cache, _rows: model(ids, cache=cache))
                mx.eval([c.state for c in g.cache])

        m = b * prompt
        x = mx.random.normal((m, hidden)).astype(dtype)
        xi = mx.random.normal((m, inter)).astype(dtype)
        mx.eval(x, xi)

        def matmul(x=x, xi=xi):
            for _ in range(layers):  # one layer's outputs at a time (M x inter is large)
                mx.eval([x @ weights[i].T for i in range(6)] + [xi @ weights[6].T])

        row: dict = {}
        for name, fn in (("plain", plain), ("group", group), ("matmul", matmul)):
            ms = _median_ms(fn, repeats)
            row[name] = {
                "ms": round(ms, 2),
                "tok_per_s": round(m / ms * 1e3, 1),
                "tflops": round(2 * params * m / ms / 1e9, 1),
            }
            print(f"rows {b:3d} x {prompt}: {name:6s} {ms:8.2f} ms  {row[name]}", flush=True)
        out["rows"][str(b)] = row
        mx.clear_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 8, 32, 64])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--group-rows", type=int, default=8, help="rows per prefill group")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = measure(args.model, args.rows, args.prompt, args.group_rows, args.repeats)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

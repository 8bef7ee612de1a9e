"""Does a rotated (Hadamard) 4-bit KV codec keep greedy decoding closer to full
precision than plain KV4 at the same bytes? (issue 28 item 3; the reference's
TurboQuant mode is a rotated low-bit codec.)

A codec here is what one token's K or V row of one head becomes in the cache:
``kv4`` is mlx-lm's affine 4-bit quantisation with groups of ``G`` along the
head dimension (``mx.quantize``, what ``--kv-quant kv4`` stores); ``rot-kv4``
multiplies the row by the orthonormal Sylvester-Hadamard matrix ``H`` (d x d)
first and quantises that, which spreads an outlier channel's energy over the
group before the scale is chosen (QuaRot, Ashkboos et al. 2024; QuIP#). The
rotation stores nothing (``H`` is fixed), so both take the same bytes per
token. Attention over the rotated cache is exact with the query rotated too
(``q.k = (qH).(kH)``) and the output rotated back (``softmax(.)(VH)H^T``), so
the probe measures each codec by quantising and dequantising the rows as they
enter a plain cache (``H^T = H``): what the model reads is exactly what a
rotated quantised cache would give it.

Measured like ``tests/real/test_kv_quant_real.py``: teacher-forced greedy
agreement (with the full-precision answer as context, the share of positions
where the codec's argmax is the full-precision token) and, decoding freely,
the share of each answer before its first divergence.

    PYTHONPATH=$PWD python benchmarks/rotated_kv_probe.py --json benchmarks/results/rotated-kv.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from tests.real.test_speculation import TASKS  # noqa: E402


def hadamard(d: int):
    """The orthonormal Sylvester-Hadamard matrix, ``(d, d)`` float32 (``d`` a power of 2)."""
    import mlx.core as mx

    h = mx.array([[1.0]])
    while h.shape[0] < d:
        h = mx.concatenate([mx.concatenate([h, h], 1), mx.concatenate([h, -h], 1)], 0)
    return h / (d**0.5)


def make_codec(name: str, bits: int, group: int):
    """``codec(x) -> x'``: ``x`` ``(..., d)`` through the cache's storage and back."""
    import mlx.core as mx

    def plain(x):
        w, s, b = mx.quantize(x.reshape(-1, x.shape[-1]), group_size=group, bits=bits)
        return mx.dequantize(w, s, b, group_size=group, bits=bits).reshape(x.shape).astype(x.dtype)

    if name == "kv4":
        return plain
    cache: dict = {}

    def rotated(x):
        d = x.shape[-1]
        h = cache.setdefault(d, hadamard(d).astype(x.dtype))
        return plain(x @ h) @ h  # H is symmetric and orthonormal: H^T = H

    return rotated


def coded_cache(model, codec):
    """A per-layer plain KV cache whose rows pass through ``codec`` on the way in."""
    from mlx_lm.models.cache import KVCache

    class Coded(KVCache):
        def update_and_fetch(self, keys, values):
            return super().update_and_fetch(codec(keys), codec(values))

    return [Coded() for _ in model.layers]


def agreement(model, cases, cache_fn) -> float:
    """Teacher-forced: the share of answer positions whose argmax is the answer's token."""
    import mlx.core as mx

    same = total = 0
    for prompt, answer in cases:
        logits = model(mx.array([*prompt, *answer[:-1]], dtype=mx.uint32)[None], cache=cache_fn())
        picks = mx.argmax(logits[0, len(prompt) - 1 :], axis=-1).tolist()
        same += sum(int(a == b) for a, b in zip(picks, answer, strict=True))
        total += len(answer)
    return same / total


def free_run(model, prompts, answers, cache_fn, n: int) -> float:
    """Decoding freely: the mean share of each answer before its first divergence."""
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    shares = []
    for prompt, want in zip(prompts, answers, strict=True):
        got = [
            int(t)
            for t, _ in generate_step(
                mx.array(prompt), model, max_tokens=n, prompt_cache=cache_fn()
            )
        ]
        k = 0
        while k < min(len(got), len(want)) and got[k] == want[k]:
            k += 1
        shares.append(k / len(want))
    return sum(shares) / len(shares)


def main(argv: list[str] | None = None) -> int:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.models.cache import make_prompt_cache

    from mlxspec.engine.model.cpu_weights import apply_cpu_weights
    from mlxspec.engine.model.loader import resolve_model

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=24, help="answer tokens per prompt")
    ap.add_argument("--groups", type=int, nargs="+", default=[64, 32])
    ap.add_argument("--bits", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    start, load_start = time.time(), os.getloadavg()
    model, tokenizer = load(str(resolve_model(None).path))
    apply_cpu_weights(model, "auto")  # float32 on the CPU, as the engine loads it
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True)
        for t in TASKS
    ]
    answers = []
    for prompt in prompts:
        steps = generate_step(mx.array(prompt), model, max_tokens=args.tokens)
        answers.append([int(t) for t, _ in steps])
    cases = list(zip(prompts, answers, strict=True))
    full = lambda: make_prompt_cache(model)  # noqa: E731
    out: dict = {
        "model": str(resolve_model(None).path),
        "prompts": len(prompts),
        "answer_tokens": args.tokens,
        "bits": args.bits,
        "full": {"teacher_forced": agreement(model, cases, full)},
        "codecs": {},
    }
    from mlxspec.engine.caches.kv_scheme import KvOptions, resolve_scheme

    scheme = resolve_scheme(KvOptions("kv4"), model, None)  # the served cache, for a check
    real = lambda: scheme.make_cache(model)  # noqa: E731
    out["served kv4 g64"] = {"teacher_forced": round(agreement(model, cases, real), 4)}
    print("served kv4 g64", json.dumps(out["served kv4 g64"]), flush=True)
    for group in args.groups:
        for name in ("kv4", "rot-kv4"):
            codec = make_codec(name, args.bits, group)
            fn = lambda codec=codec: coded_cache(model, codec)  # noqa: E731
            row = {
                "teacher_forced": round(agreement(model, cases, fn), 4),
                "free_prefix_share": round(free_run(model, prompts, answers, fn, args.tokens), 4),
            }
            out["codecs"][f"{name} g{group}"] = row
            print(name, f"g{group}", json.dumps(row), flush=True)
    out["loadavg"] = [load_start, os.getloadavg()]
    out["seconds"] = round(time.time() - start, 1)
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

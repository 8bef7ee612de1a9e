"""Write a random-weight Llama-shaped MLX model folder for timing runs.

Random weights time exactly like trained ones (same shapes, same kernels); only
the text is meaningless, and the benchmark forbids EOS so every request
generates its full budget. The tokenizer files are copied from an existing
model folder (e.g. the converted embedded SmolLM2), whose vocabulary sets the
embedding size.

    python benchmarks/make_random_model.py OUT --size 8b --tokenizer-from DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

#: Llama shapes: (hidden, layers, intermediate, heads, kv_heads). 8b is
#: Llama-3-8B's body; 1b is Llama-3.2-1B's; 135m is SmolLM2-135M's (its embedding
#: tied to the output, as there), for CPU runs.
SIZES = {
    "135m": (576, 30, 1536, 9, 3),
    "1b": (2048, 16, 8192, 32, 8),
    "8b": (4096, 32, 14336, 32, 8),
}
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--size", choices=sorted(SIZES), default="8b")
    ap.add_argument("--tokenizer-from", type=Path, required=True)
    ap.add_argument("--context", type=int, default=8192)
    ap.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    args = ap.parse_args(argv)

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models.llama import Model, ModelArgs

    src = json.loads((args.tokenizer_from / "config.json").read_text())
    hidden, layers, inter, heads, kv = SIZES[args.size]
    config = {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": layers,
        "intermediate_size": inter,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "rms_norm_eps": 1e-5,
        "vocab_size": src["vocab_size"],
        "rope_theta": 500000.0,
        "max_position_embeddings": args.context,
        "tie_word_embeddings": args.size == "135m",
        "torch_dtype": args.dtype,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    mx.random.seed(0)
    model = Model(ModelArgs.from_dict(config))
    model.set_dtype(getattr(mx, args.dtype))
    params = dict(tree_flatten(model.parameters()))
    n = sum(v.size for v in params.values())
    mx.save_safetensors(str(args.out / "model.safetensors"), params)
    (args.out / "config.json").write_text(json.dumps(config, indent=2))
    for name in TOKENIZER_FILES:
        if (args.tokenizer_from / name).exists():
            shutil.copy(args.tokenizer_from / name, args.out / name)
    print(f"wrote {args.out}: {n / 1e9:.2f}B parameters, {args.size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Two LoRA adapters folded into one (``POST /api/finetune/merge``), exactly.

mlx-lm's ``LoRALinear`` adds ``scale * (x @ lora_a) @ lora_b``. Two adapters'
sums are one LoRA of rank ``r_a + r_b``: ``lora_a`` side by side
(``[a_1 | a_2]``, shape ``(in, r_a + r_b)``) and ``lora_b`` stacked with each
source's scale folded in (``[s_1 b_1 ; s_2 b_2]``), under scale 1. A layer only
one adapter has gets zeros in the other's half. The scales default to each
adapter's own ``lora_parameters.scale``. Run as ``python -m mlxspec.jobs.merge
A B OUT SCALE_A SCALE_B`` (MLX stays out of the server's threads); it prints the
stats as one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["merge_adapters"]


def _config(folder: Path) -> dict[str, Any]:
    config = json.loads((folder / "adapter_config.json").read_text())
    if config.get("fine_tune_type", "lora") != "lora":
        raise ValueError(f"{folder}: only LoRA adapters merge (not {config['fine_tune_type']})")
    return dict(config)


def merge_adapters(a: Path, b: Path, out: Path, scales: tuple[float, float] | None) -> dict:
    """Write the merged adapter of ``a`` and ``b`` into ``out``.

    Args:
        a (Path): the first adapter folder (``mlx_lm.lora``'s layout).
        b (Path): the second.
        out (Path): the new folder (created).
        scales (tuple[float, float] | None): each source's scale; ``None``: theirs.

    Returns:
        dict: ``{layersMerged, layersOnlyInOne, totalKeysOut, sources, scales}``.

    Raises:
        ValueError: a folder is not a LoRA adapter, or their shapes disagree.
    """
    import mlx.core as mx

    configs = [_config(a), _config(b)]
    ranks = [int(c["lora_parameters"]["rank"]) for c in configs]
    used = list(scales) if scales else [float(c["lora_parameters"]["scale"]) for c in configs]
    weights = [mx.load(str(f / "adapters.safetensors")) for f in (a, b)]
    layers = sorted({k.rsplit(".", 1)[0] for w in weights for k in w})
    merged, both = {}, 0
    for layer in layers:
        parts_a, parts_b = [], []
        for w, scale in zip(weights, used, strict=True):
            la, lb = w.get(f"{layer}.lora_a"), w.get(f"{layer}.lora_b")
            parts_a.append(la)
            parts_b.append(None if lb is None else lb * scale)
        present = [p for p in parts_a if p is not None]
        both += len(present) == 2
        ref_a = present[0]
        ref_b = next(p for p in parts_b if p is not None)
        for i, rank in enumerate(ranks):
            if parts_a[i] is None:
                parts_a[i] = mx.zeros((ref_a.shape[0], rank), dtype=ref_a.dtype)
                parts_b[i] = mx.zeros((rank, ref_b.shape[1]), dtype=ref_b.dtype)
        merged[f"{layer}.lora_a"] = mx.concatenate(parts_a, axis=1)
        merged[f"{layer}.lora_b"] = mx.concatenate(parts_b, axis=0)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "adapters.safetensors"), merged)
    config = dict(configs[0])
    params = dict(config["lora_parameters"], rank=sum(ranks), scale=1.0)
    keys = set(configs[0]["lora_parameters"].get("keys") or ())
    keys |= set(configs[1]["lora_parameters"].get("keys") or ())
    if keys:
        params["keys"] = sorted(keys)
    config["lora_parameters"] = params
    config["num_layers"] = max(int(c.get("num_layers", -1)) for c in configs)
    if -1 in (int(c.get("num_layers", -1)) for c in configs):
        config["num_layers"] = -1
    config["adapter_path"] = str(out)
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return {
        "layersMerged": both, "layersOnlyInOne": len(layers) - both,
        "totalKeysOut": len(merged), "sources": [str(a), str(b)], "scales": used,
    }  # fmt: skip


if __name__ == "__main__":
    a, b, out, sa, sb = sys.argv[1:6]
    pair = None if sa == "-" else (float(sa), float(sb))
    print(json.dumps(merge_adapters(Path(a), Path(b), Path(out), pair)))

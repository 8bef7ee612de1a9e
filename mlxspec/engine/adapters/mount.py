"""Mounting an adapter folder onto a live model through mlx-lm's LoRA layers.

mlx-lm's tuner does the reading and checking: :func:`mount_folder` puts the
model's base layers back where :class:`~.mixing.AdapterLinear` wrappers sit,
lets ``mlx_lm.tuner.utils.load_adapters`` convert it (``linear_to_lora_layers``
with the folder's ``num_layers`` and ``lora_parameters``) and load
``adapters.safetensors`` (which refuses a tensor the model has no place for or
whose shape differs), takes each resulting ``LoRALinear``'s ``lora_a``,
``lora_b`` and ``scale``, and restores the base layers and wrappers whatever
happened. Only then are the matrices added to the wrappers, so a folder that
does not fit mounts nothing. Engine thread only: no forward pass runs meanwhile.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_unflatten

from mlxspec.engine.adapters.files import AdapterFolder
from mlxspec.engine.adapters.mixing import AdapterLinear, AdapterMix
from mlxspec.engine.adapters.spec import AdapterError


@dataclass(frozen=True)
class LoraWeights:
    """One layer's share of an adapter, as mlx-lm's ``LoRALinear`` held it.

    Args:
        path (str): the layer's module path (``model.layers.29.self_attn.q_proj``).
        base (nn.Module): the base layer the adapter modifies.
        lora_a (mx.array): shape ``(in, r)``.
        lora_b (mx.array): shape ``(r, out)``.
        scale (float): the LoRA scale.
    """

    path: str
    base: nn.Module
    lora_a: mx.array
    lora_b: mx.array
    scale: float


def read_lora(
    model: nn.Module, wrappers: dict[str, AdapterLinear], folder: AdapterFolder
) -> list[LoraWeights]:
    """The adapter in ``folder`` as per-layer LoRA matrices for ``model``, read by
    mlx-lm's ``load_adapters``; ``model`` is left as it was.

    Args:
        model (nn.Module): the served mlx-lm model (its wrappers in place).
        wrappers (dict[str, AdapterLinear]): the wrappers by module path.
        folder (AdapterFolder): the adapter folder.

    Returns:
        list[LoraWeights]: one per converted layer, evaluated.

    Raises:
        AdapterError: not a LoRA adapter, a layer type that cannot be mixed per
            row, or tensors that do not fit the model (mlx-lm's list of them).
    """
    from mlx_lm.tuner.lora import LoRALinear
    from mlx_lm.tuner.utils import load_adapters

    if folder.fine_tune_type != "lora":
        raise AdapterError(
            f"adapter {folder.path} is a '{folder.fine_tune_type}' fine-tune: only LoRA "
            "adapters can be mounted",
            "path",
        )
    _install(model, [(path, w.base) for path, w in wrappers.items()])
    try:
        try:
            load_adapters(model, str(folder.path))
        except (ValueError, KeyError, TypeError, AttributeError, OSError) as exc:
            raise AdapterError(
                f"adapter {folder.path} does not fit the model: {exc}", "path"
            ) from exc
        lora = [(p, m) for p, m in model.named_modules() if "lora_a" in m or "lora_b" in m]
        odd = sorted({type(m).__name__ for _, m in lora if not isinstance(m, LoRALinear)})
        if odd:
            raise AdapterError(
                f"adapter {folder.path} converts layers to {', '.join(odd)}: only LoRALinear "
                "layers can be mixed per row",
                "path",
            )
        if not lora:
            raise AdapterError(f"adapter {folder.path} converts no layer of the model", "path")
        _check_loaded(folder, {p for p, _ in lora})
        found = [LoraWeights(p, m.linear, m.lora_a, m.lora_b, float(m.scale)) for p, m in lora]
        mx.eval([(w.lora_a, w.lora_b) for w in found])
        return found
    finally:
        _restore(model, wrappers)


def _check_loaded(folder: AdapterFolder, paths: set[str]) -> None:
    """Every converted layer got both matrices from the file (mlx-lm leaves a
    random ``lora_a`` and a zero ``lora_b`` where the file has none)."""
    names = set(mx.load(str(folder.path / "adapters.safetensors")))
    missing = sorted(
        f"{p}.{leaf}" for p in paths for leaf in ("lora_a", "lora_b") if f"{p}.{leaf}" not in names
    )
    if missing:
        shown = ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else "")
        raise AdapterError(
            f"adapter {folder.path} lacks {len(missing)} tensors its config asks for: {shown}",
            "path",
        )


def _install(model: nn.Module, modules: list[tuple[str, nn.Module]]) -> None:
    if modules:
        model.update_modules(tree_unflatten(modules))


def _restore(model: nn.Module, wrappers: dict[str, AdapterLinear]) -> None:
    """Put the base layer back wherever mlx-lm left a LoRA layer, and the wrappers
    back in their places."""
    converted = [(p, m.linear) for p, m in model.named_modules() if "lora_a" in m and "linear" in m]
    _install(model, converted)
    _install(model, list(wrappers.items()))


def mount_weights(
    model: nn.Module,
    wrappers: dict[str, AdapterLinear],
    mix: AdapterMix,
    slot: int,
    weights: list[LoraWeights],
) -> None:
    """Add ``weights`` as global ``slot`` to the layers' wrappers (new wrappers
    replace the base layers that had none) and install them.

    Args:
        model (nn.Module): the served model.
        wrappers (dict[str, AdapterLinear]): the wrappers by path, updated.
        mix (AdapterMix): the model's shared selection.
        slot (int): the adapter's global slot (>= 1).
        weights (list[LoraWeights]): from :func:`read_lora`.
    """
    for w in weights:
        wrapper = wrappers.get(w.path)
        if wrapper is None:
            wrapper = wrappers[w.path] = AdapterLinear(w.base, mix)
        wrapper.add(slot, w.lora_a, w.lora_b, w.scale)
    _install(model, [(w.path, wrappers[w.path]) for w in weights])


def unmount_slot(model: nn.Module, wrappers: dict[str, AdapterLinear], slot: int) -> int:
    """Remove global ``slot`` from every wrapper; a wrapper left empty gives its
    place back to the base layer. Returns how many layers held the slot."""
    removed, emptied = 0, []
    for path, wrapper in list(wrappers.items()):
        if slot in wrapper.members:
            wrapper.remove(slot)
            removed += 1
            if not wrapper.members:
                emptied.append((path, wrapper.base))
                del wrappers[path]
    _install(model, emptied)
    return removed


def weights_digest(weights: list[LoraWeights]) -> str:
    """A BLAKE2b digest of the mounted numbers: every layer's path, scale and
    matrices (dtype, shape, bytes), so replacing an adapter's files under the same
    id gives another digest (the prompt cache's namespace)."""
    h = hashlib.blake2b(digest_size=16)
    for w in sorted(weights, key=lambda w: w.path):
        h.update(json.dumps([w.path, w.scale]).encode())
        for array in (w.lora_a, w.lora_b):
            h.update(json.dumps([str(array.dtype), list(array.shape)]).encode())
            h.update(_bytes(array))
    return h.hexdigest()


def _bytes(array: mx.array) -> bytes:
    if array.dtype == mx.bfloat16:  # numpy has no bfloat16: hash its bits
        array = array.view(mx.uint16)
    return np.asarray(array).tobytes()


def describe_layers(weights: list[LoraWeights]) -> dict[str, Any]:
    """``rank`` (the largest), ``scale`` (the first layer's) and
    ``mounted_layers`` of an adapter's weights."""
    return {
        "rank": max(int(w.lora_a.shape[1]) for w in weights),
        "scale": weights[0].scale,
        "mounted_layers": len(weights),
    }

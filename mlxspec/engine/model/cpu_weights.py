"""Float32 weights for MLX's CPU backend when an optimised BLAS is loaded.

On the CPU, MLX multiplies quantized weights with its own kernels and
float16/bfloat16 weights through conversions, both at roughly the speed of the
reference BLAS (~1.5 GFLOP/s on a 2-core Xeon); float32 products go to
``cblas_sgemm``, which :mod:`mlxspec.host.blas` points at MKL (~100 GFLOP/s). Holding
the weights as float32 then makes prefill about 20x and batched decode about 8x
faster on the embedded SmolLM2-135M (``benchmarks/results/cpu-blas.json``).

Dequantizing uses mlx-lm's :func:`mlx_lm.utils.dequantize_model`; the float32
values equal the quantized ones exactly (``w = scale * q + bias`` per group), so
only the arithmetic precision of activations changes (float32 instead of the
checkpoint's float16), as it would for any float32 checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_flatten

from mlxspec.host import blas

__all__ = ["CPU_WEIGHT_MODES", "CpuWeights", "apply_cpu_weights", "float32_bytes"]

CPU_WEIGHT_MODES = ("auto", "float32", "native")
"""``--cpu-weights`` choices: ``auto`` (float32 when it pays and fits), ``float32``
(always on the CPU), ``native`` (as the checkpoint stores them)."""

RAM_SHARE = 0.25
"""``auto`` converts only when the float32 weights take at most this share of RAM."""


@dataclass(frozen=True)
class CpuWeights:
    """What :func:`apply_cpu_weights` did.

    Attributes:
        float32 (bool): the weights are now float32.
        reason (str): why (or why not), for the start-up log and ``/stats``.
        nbytes (int): bytes of the weights as now held.
    """

    float32: bool
    reason: str
    nbytes: int


def float32_bytes(model: nn.Module) -> int:
    """Bytes ``model``'s parameters would take as dense float32.

    A quantized layer (``scales`` beside a packed uint32 ``weight``) counts
    ``weight.size * 32 / bits`` values; its ``scales``/``biases`` vanish.

    Args:
        model (nn.Module): an ``mlx_lm`` model.

    Returns:
        int: bytes (4 per value).
    """
    values = 0
    for _, module in _flat(model.leaf_modules(), is_leaf=nn.Module.is_module):
        params = dict(tree_flatten(module.parameters()))
        bits = getattr(module, "bits", None)
        if bits and "scales" in params:
            values += params["weight"].size * 32 // bits
            values += params["bias"].size if "bias" in params else 0
        else:
            values += sum(v.size for v in params.values())
    return 4 * values


def _flat(tree: Any, is_leaf: Callable[..., bool] | None = None) -> list[tuple[str, Any]]:
    """``tree_flatten``'s ``(path, leaf)`` list (its stub also admits the dict it
    fills when given a dict ``destination``, which this module never passes)."""
    return cast(list[tuple[str, Any]], tree_flatten(tree, is_leaf=is_leaf))


def _held_bytes(model: nn.Module) -> int:
    return sum(v.nbytes for _, v in _flat(model.parameters()))


def _ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def apply_cpu_weights(model: nn.Module, mode: str = "auto") -> CpuWeights:
    """Convert ``model``'s weights to float32 in place when the CPU gains from it.

    ``auto`` converts when MLX runs on the CPU, an optimised BLAS is loaded
    (:func:`mlxspec.host.blas.status`), some weights are not float32 and the float32
    weights fit in :data:`RAM_SHARE` of physical memory. ``float32`` converts on
    the CPU regardless of BLAS and size; ``native`` never converts.

    Args:
        model (nn.Module): an ``mlx_lm`` model (modified in place).
        mode (str): one of :data:`CPU_WEIGHT_MODES`. Default: ``"auto"``.

    Returns:
        CpuWeights: the outcome.

    Raises:
        ValueError: ``mode`` is not one of :data:`CPU_WEIGHT_MODES`.
    """
    if mode not in CPU_WEIGHT_MODES:
        raise ValueError(f"cpu weights mode must be one of {', '.join(CPU_WEIGHT_MODES)}")
    held = _held_bytes(model)
    why_not = _why_not(model, mode)
    if why_not is not None:
        return CpuWeights(False, why_not, held)
    from mlx_lm.utils import dequantize_model

    dequantize_model(model)
    model.set_dtype(mx.float32)
    mx.eval(model.parameters())
    if blas.status().fast:
        reason = f"float32 for the CPU BLAS ({blas.status().reason})"
    else:  # forced: the products stay at reference-BLAS speed
        reason = f"--cpu-weights float32, but no optimised BLAS ({blas.status().reason})"
    return CpuWeights(True, reason, _held_bytes(model))


def _why_not(model: nn.Module, mode: str) -> str | None:
    if mode == "native":
        return "--cpu-weights native"
    if mx.default_device().type != mx.DeviceType.cpu:
        return "not on the CPU"
    dtypes = {v.dtype for _, v in _flat(model.parameters())}
    if dtypes == {mx.float32}:
        return "already float32"
    if mode == "float32":
        return None
    if not blas.status().fast:
        return f"no optimised BLAS ({blas.status().reason})"
    need = float32_bytes(model)
    if need > RAM_SHARE * _ram_bytes():
        return f"float32 weights ({need >> 20} MiB) exceed {RAM_SHARE:.0%} of RAM"
    return None

"""A model on disk against this machine: ``/fit``'s memory model over its config.

The weights' bytes (safetensors index or file sizes) and the KV cache bytes per
token (``layers x kv_heads x head_dim x 2 x dtype bytes``, the same product
:func:`mlxspec.engine.model.fit.model_memory` takes of a loaded model) go into
:class:`~mlxspec.engine.model.fit.ModelMemory`, whose ``context_for`` and
``decode_tps`` answer ``/fit`` for the served model: the rows agree with it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mlxspec.library.scan import LocalModel

if TYPE_CHECKING:  # imported when used: the --isolate parent scans without MLX
    from mlxspec.engine.model.fit import ModelMemory

#: Context at which a row's decode rate is predicted (``/fit``'s typical 8192;
#: the reference's ``/api/hub/local`` verdict is "at a fixed 8k context").
TYPICAL_CONTEXT = 8192
#: Bytes per KV element by the config's ``torch_dtype`` (activations run in it).
_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


@dataclass(frozen=True)
class Machine:
    """What a model is assessed against.

    Attributes:
        usable_bytes (int): memory a model may take (free RAM, or the GPU's free memory).
        bandwidth_gbs (float): memory bandwidth, GB/s.
    """

    usable_bytes: int
    bandwidth_gbs: float


@dataclass(frozen=True)
class Assessment:
    """A row's fit: the reference's ``assessment`` object.

    Attributes:
        fits (bool): the weights fit and leave room for ``context`` (or one) token.
        max_safe_context (int): tokens of context that fit, capped by the model's window.
        predicted_decode_tps (float): one sequence's memory-bound decode rate at
            ``min(context or 8192, max_safe_context)`` tokens.
    """

    fits: bool
    max_safe_context: int
    predicted_decode_tps: float


@functools.cache
def _bandwidth() -> float:
    from mlxspec.host import machine

    return machine.bandwidth_gbs()


def current_machine(budget: int | None = None) -> Machine:
    """This machine now: ``budget`` bytes (the server's ``--memory-budget``) or
    the GPU's free memory or available RAM; the host bandwidth probe (measured
    once per process, ~0.1 s)."""
    from mlxspec.host import machine

    if budget is None:
        gpu = machine.gpu()
        free = gpu.free_bytes if gpu is not None and gpu.free_bytes is not None else None
        budget = free if free is not None else machine.memory()[1] or 0
    return Machine(int(budget), _bandwidth())


def _num(config: Mapping[str, Any], *names: str) -> int | None:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_memory(config: Mapping[str, Any], weights_bytes: int) -> ModelMemory | None:
    """The :class:`ModelMemory` of a config (a VLM's ``text_config`` wins);
    ``None`` without layers, heads or hidden size."""
    from mlxspec.engine.model.fit import ModelMemory

    text = config.get("text_config")
    merged = {**config, **text} if isinstance(text, dict) else dict(config)
    layers = _num(merged, "num_hidden_layers", "n_layer", "num_layers")
    heads = _num(merged, "num_attention_heads", "n_head")
    hidden = _num(merged, "hidden_size", "n_embd", "d_model")
    if layers is None or heads is None or (hidden is None and not _num(merged, "head_dim")):
        return None
    kv_heads = _num(merged, "num_key_value_heads") or heads
    head_dim = _num(merged, "head_dim") or (hidden or 0) // heads
    dtype = str(merged.get("torch_dtype") or merged.get("dtype") or "bfloat16")
    per_token = layers * kv_heads * head_dim * 2 * _DTYPE_BYTES.get(dtype, 2)
    return ModelMemory(weights_bytes, per_token, dtype, layers)


def window(config: Mapping[str, Any]) -> int:
    """The model's context window: ``max_position_embeddings`` (a VLM's
    ``text_config`` first), else 4096 (the loader's fallback)."""
    text = config.get("text_config")
    for source in (text if isinstance(text, dict) else {}, config):
        if found := _num(source, "max_position_embeddings", "n_positions", "max_seq_len"):
            return found
    return 4096


def assess(row: LocalModel, machine: Machine, context: int | None = None) -> Assessment | None:
    """How ``row`` fits ``machine``.

    Args:
        row (LocalModel): a scanned model.
        machine (Machine): memory and bandwidth.
        context (int | None): the context wanted; ``fits`` then also asks that
            it fits. Default: ``None`` (any context).

    Returns:
        Assessment | None: ``None`` when the config does not say the model's
        shape (the reference: "null if config unreadable") or no weights are on disk.
    """
    if not row.config or row.weights_bytes <= 0 or row.source in ("whisper", "adapter"):
        return None
    memory = model_memory(row.config, row.weights_bytes)
    if memory is None:
        return None
    safe = min(window(row.config), memory.context_for(machine.usable_bytes))
    at = min(context or TYPICAL_CONTEXT, safe)
    return Assessment(
        fits=safe >= (context or 1),
        max_safe_context=safe,
        predicted_decode_tps=memory.decode_tps(machine.bandwidth_gbs, at) if safe > 0 else 0.0,
    )

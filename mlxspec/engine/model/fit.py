"""How much memory a loaded model needs: weights, KV cache per token, context fit.

Pure arithmetic over an mlx-lm model's parameters and ``ModelArgs``; no
allocation. Used for operator memory budgets (admission) and ``GET /fit``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

#: Share of the usable memory held back for activations, logits and allocator
#: slack when estimating how much context fits (an estimate, not a measurement).
TRANSIENT_FRACTION = 0.1


@dataclass(frozen=True)
class ModelMemory:
    """Memory facts of a loaded model.

    Args:
        weights_bytes (int): bytes of all parameters (quantised weights included
            as stored).
        kv_bytes_per_token (int): KV cache bytes one token of one sequence adds:
            ``layers x kv_heads x head_dim x 2 (K and V) x dtype bytes``.
        kv_dtype (str): the activation dtype the KV cache is kept in, e.g. ``"bfloat16"``.
        layers (int): transformer layers holding a KV cache.
    """

    weights_bytes: int
    kv_bytes_per_token: int
    kv_dtype: str
    layers: int

    def context_for(self, usable_bytes: int) -> int:
        """Tokens of KV cache that fit in ``usable_bytes`` once the weights and the
        transient reserve (:data:`TRANSIENT_FRACTION` of ``usable_bytes``) are paid.

        Returns:
            int: tokens, ``0`` when the weights alone do not fit.
        """
        room = usable_bytes - self.weights_bytes - self.transient_bytes(usable_bytes)
        return max(0, room // max(1, self.kv_bytes_per_token))

    def decode_tps(self, bandwidth_gbs: float, context: int) -> float:
        """Memory-bound decode rate of one sequence, tokens/s: each token reads
        every weight and the KV cache of ``context`` tokens once (``/fit``'s and
        the model library's prediction).

        Args:
            bandwidth_gbs (float): memory bandwidth, GB/s (1e9 bytes).
            context (int): tokens of KV cache read per step.
        """
        per_token = self.weights_bytes + self.kv_bytes_per_token * context
        return round(bandwidth_gbs * 1e9 / max(1, per_token), 2)

    @staticmethod
    def transient_bytes(usable_bytes: int) -> int:
        """The reserve kept for activations and allocator slack, in bytes."""
        return int(usable_bytes * TRANSIENT_FRACTION)


def model_memory(model: Any) -> ModelMemory:
    """Measure ``model``'s weights and derive its per-token KV cache size.

    Args:
        model: an mlx-lm model (``nn.Module`` with ``args``, a ``ModelArgs``).

    Returns:
        ModelMemory: the sizes; KV fields fall back to ``hidden_size`` and
        ``num_attention_heads`` when ``num_key_value_heads`` or ``head_dim`` are
        absent (mlx-lm's Llama defaults).
    """
    from mlx.utils import tree_flatten

    # tree_flatten's stub also admits the dict it fills for a dict ``destination``.
    params = [value for _, value in cast(list[tuple[str, Any]], tree_flatten(model.parameters()))]
    weights = sum(int(p.nbytes) for p in params)
    dtype = _activation_dtype(params)
    args = getattr(model, "args", None)
    layers = int(_arg(args, "num_hidden_layers", len(getattr(model, "layers", ())) or 0))
    heads = int(_arg(args, "num_attention_heads", 1))
    kv_heads = int(_arg(args, "num_key_value_heads", heads) or heads)
    hidden = int(_arg(args, "hidden_size", 0))
    head_dim = int(_arg(args, "head_dim", 0) or (hidden // heads if heads else 0))
    per_token = layers * kv_heads * head_dim * 2 * dtype.size
    return ModelMemory(weights, per_token, _dtype_name(dtype), layers)


def _arg(args: Any, name: str, default: Any) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def _activation_dtype(params: list) -> Any:
    """The dtype activations (and so the KV cache) use: that of the first
    floating parameter (a quantised model's scales; packed weights are uint32)."""
    import mlx.core as mx

    for p in params:
        if mx.issubdtype(p.dtype, mx.floating):
            return p.dtype
    return mx.float16


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("mlx.core.")

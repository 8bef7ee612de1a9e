"""Each rank's shard of the weights, as ``mlx_lm.utils.sharded_load`` makes it.

The model is loaded lazily (``mlx_lm.load(..., lazy=True)``: the safetensors are
mapped, nothing is read), split, then evaluated, so a rank reads only the tensors
of its shard: tensor parallel through the model's own ``shard(group)`` (every
layer's attention heads and MLP columns split), or with ``--pipeline`` the
model's ``model.pipeline(group)`` (a run of layers per rank; mlx-lm's
``PipelineMixin``).
"""

from __future__ import annotations

from typing import Any

from mlxspec.engine.distributed.group import Topology


class ShardError(ValueError):
    """The model cannot be split as asked (a one-line start-up error)."""


def shard_problem(model: Any, topology: Topology) -> str | None:
    """Why ``model`` cannot be split over ``topology``, or ``None``.

    Tensor parallelism needs ``shard()`` and head counts the world size divides
    (SmolLM2-135M's 9 heads and 3 KV heads do not split in two); a pipeline needs
    ``model.model.pipeline`` and at least one layer per rank.
    """
    n = topology.size
    if topology.pipeline:
        inner: Any = getattr(model, "model", None)
        if not hasattr(inner, "pipeline"):
            return (
                f"{type(model).__module__.rsplit('.', 1)[-1]} models cannot be pipelined by mlx-lm"
            )
        if len(inner.layers) < n:
            return f"{len(inner.layers)} layers cannot be split over {n} processes"
        return None
    if not hasattr(model, "shard"):
        return f"{type(model).__module__.rsplit('.', 1)[-1]} models have no tensor-parallel shard()"
    args = getattr(model, "args", None)
    for name in ("num_attention_heads", "num_key_value_heads"):
        heads = getattr(args, name, None)
        if isinstance(heads, int) and heads % n:
            return f"{name} {heads} does not split over {n} processes (try --pipeline)"
    return None


def apply_shard(model: Any, topology: Topology) -> None:
    """Split the lazily loaded ``model`` in place for ``topology``'s rank.

    Raises:
        ShardError: :func:`shard_problem` names why it cannot be split.
    """
    if (problem := shard_problem(model, topology)) is not None:
        raise ShardError(problem)
    if topology.pipeline:
        model.model.pipeline(topology.group)
    else:
        model.shard(topology.group)

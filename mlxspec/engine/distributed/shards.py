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
    ``model.model.pipeline`` and at least one layer per rank. The message
    suggests only what works for this architecture (:func:`_alternatives`).
    """
    n = topology.size
    arch = type(model).__module__.rsplit(".", 1)[-1]
    if topology.pipeline:
        if not _can_pipeline(model, 1):
            problem = f"{arch} models cannot be pipelined by mlx-lm"
        elif not _can_pipeline(model, n):
            problem = f"{len(model.model.layers)} layers cannot be split over {n} processes"
        else:
            return None
    elif not hasattr(model, "shard"):
        problem = f"{arch} models have no tensor-parallel shard() in mlx-lm"
    elif (heads := _unsplit_heads(model, n)) is not None:
        problem = f"{heads} do not split over {n} processes"
    else:
        return None
    hint = _alternatives(model, topology)
    return f"{problem} ({hint})" if hint else problem


def _heads(model: Any) -> dict[str, int]:
    args = getattr(model, "args", None)
    names = ("num_attention_heads", "num_key_value_heads")
    return {name: h for name in names if isinstance(h := getattr(args, name, None), int)}


def _unsplit_heads(model: Any, n: int) -> str | None:
    """``"num_attention_heads 9 and num_key_value_heads 3"`` when ``n`` does not
    divide them all, else ``None``."""
    heads = _heads(model)
    if all(h % n == 0 for h in heads.values()):
        return None
    return " and ".join(f"{name} {h}" for name, h in heads.items())


def _tensor_sizes(model: Any) -> list[int]:
    """World sizes from 2 to 16 that split every head count (model has ``shard()``)."""
    if not hasattr(model, "shard"):
        return []
    heads = list(_heads(model).values())
    return [n for n in range(2, 17) if all(h % n == 0 for h in heads)]


def _can_pipeline(model: Any, n: int) -> bool:
    inner: Any = getattr(model, "model", None)
    return hasattr(inner, "pipeline") and len(getattr(inner, "layers", ())) >= n


def _alternatives(model: Any, topology: Topology) -> str:
    """What would run this architecture instead, or ``""``: ``--pipeline`` only
    where mlx-lm pipelines it, tensor parallelism only where ``shard()`` exists,
    with the world sizes that split its heads."""
    n, hints = topology.size, []
    if not topology.pipeline and _can_pipeline(model, n):
        hints.append(f"--pipeline splits its layers over {n} processes")
    sizes = _tensor_sizes(model)
    without = "without --pipeline, " if topology.pipeline else ""
    if topology.pipeline and n in sizes:
        hints.append(f"{without}its heads split over {n} processes")
    elif others := [k for k in sizes if k != n][:3]:
        counts = " or ".join(f"mlx.launch -n {k}" for k in others)
        hints.append(f"{without}{counts} splits its heads")
    return "; ".join(hints)


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

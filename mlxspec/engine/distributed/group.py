"""The process group: which launch started us, the group, and each rank's share.

MLX's launchers tell a process its place through the environment (``mlx.launch``:
``MLX_RANK`` with ``MLX_HOSTFILE`` for ring, ``MLX_JACCL_COORDINATOR`` for JACCL,
``NCCL_HOST_IP`` for NCCL; ``mpirun``: ``OMPI_COMM_WORLD_SIZE``).
:func:`detect_launch` reads it without importing MLX, so a plain
``mlxspec serve`` never initialises a backend.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


def detect_launch(env: Mapping[str, str] | None = None) -> str | None:
    """The backend a launcher prepared this process for, or ``None`` (one process).

    Args:
        env (Mapping[str, str] | None): the environment. Default: ``os.environ``.

    Returns:
        str | None: ``"ring"``, ``"jaccl"``, ``"nccl"`` or ``"mpi"``; ``None`` when
        no launcher's variables are set.
    """
    env = os.environ if env is None else env
    if env.get("MLX_JACCL_COORDINATOR") or env.get("MLX_IBV_DEVICES"):
        return "jaccl"
    if env.get("NCCL_HOST_IP") and env.get("MLX_WORLD_SIZE"):
        return "nccl"
    if env.get("MLX_HOSTFILE") and env.get("MLX_RANK"):
        return "ring"
    if env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE"):
        return "mpi"
    return None


@dataclass(frozen=True)
class Topology:
    """This process's place in the group.

    Args:
        group: the ``mx.distributed.Group`` of every rank.
        backend (str): the backend's name (``ring``, ``mpi``, ``nccl``, ``jaccl``).
        pipeline (bool): layers split across ranks (``--pipeline``); else tensor
            parallel (each layer's heads and MLP split, the model's ``shard()``).
    """

    group: Any
    backend: str
    pipeline: bool

    @property
    def rank(self) -> int:
        """This process's rank; 0 serves HTTP."""
        return int(self.group.rank())

    @property
    def size(self) -> int:
        """Processes in the group (``world_size``)."""
        return int(self.group.size())

    def all_sum(self, values: list[int]) -> list[int]:
        """Element-wise sum of ``values`` over the ranks (int64; one collective).

        Raises:
            RuntimeError: a peer is gone (MLX's backend message).
        """
        import mlx.core as mx
        import numpy as np

        out = mx.distributed.all_sum(
            mx.array(values, dtype=mx.int64), group=self.group, stream=mx.cpu
        )
        return [int(v) for v in np.array(out, copy=False)]

    def gather(self, row: list[int]) -> list[list[int]]:
        """Every rank's ``row`` (the same length on each), in rank order: one
        ``all_sum`` where each rank fills its own slots. Every rank must call
        it at the same point (it is a collective)."""
        width = len(row)
        slots = [0] * (self.size * width)
        slots[self.rank * width : (self.rank + 1) * width] = row
        summed = self.all_sum(slots)
        return [summed[r * width : (r + 1) * width] for r in range(self.size)]

    def agree_seed(self) -> int:
        """Seed MLX's global random stream with one value on every rank (rank
        0's), so unseeded sampling draws the same tokens everywhere (as
        ``mlx_lm.server`` does); returns the seed."""
        import mlx.core as mx
        import numpy as np

        mine = int(np.array(mx.random.randint(0, 2**31 - 1, (1,)))[0]) if self.rank == 0 else 0
        seed = self.all_sum([mine])[0]
        mx.random.seed(seed)
        return seed


Span = tuple[int, int]


@dataclass(frozen=True)
class RankShare:
    """What one rank holds of the model.

    Args:
        rank (int): the rank.
        weights_bytes (int): bytes of the weights it loaded.
        layers (Span): its decoder layers, first and last (inclusive, 0-based):
            every layer in tensor mode, a run of them with ``--pipeline``.
        attention_heads (Span | None): the query heads of each of its layers it
            computes (inclusive); ``None`` when the model does not say.
        kv_heads (Span | None): the key/value heads likewise.
    """

    rank: int
    weights_bytes: int
    layers: Span
    attention_heads: Span | None = None
    kv_heads: Span | None = None

    def row(self) -> list[int]:
        """The share as ints for :meth:`Topology.gather` (-1: not known)."""
        heads = self.attention_heads or (-1, -1)
        kv = self.kv_heads or (-1, -1)
        return [self.weights_bytes, *self.layers, *heads, *kv]

    @staticmethod
    def from_row(rank: int, row: list[int]) -> RankShare:
        """The share :meth:`row` made."""

        def span(a: int, b: int) -> Span | None:
            return None if a < 0 else (a, b)

        return RankShare(rank, row[0], (row[1], row[2]), span(row[3], row[4]), span(row[5], row[6]))

    def text(self, heads_of: tuple[int, int] | None) -> str:
        """``"layers 0-29, heads 0-4 of 9 (KV 0-1 of 3), 130 MiB"`` (a start-up line's part)."""
        parts = [f"layers {self.layers[0]}-{self.layers[1]}"]
        if self.attention_heads is not None and heads_of is not None:
            (a, b), (k0, k1) = self.attention_heads, self.kv_heads or (0, heads_of[1] - 1)
            parts.append(f"heads {a}-{b} of {heads_of[0]} (KV {k0}-{k1} of {heads_of[1]})")
        parts.append(f"{self.weights_bytes / 2**20:.1f} MiB")
        return ", ".join(parts)


@dataclass(frozen=True)
class GroupInfo:
    """What ``/stats`` and ``/fit`` show of the group.

    Args:
        world_size (int): processes in the group.
        backend (str): MLX's backend.
        mode (str): ``"tensor"`` or ``"pipeline"``.
        ranks (tuple[RankShare, ...]): what each rank holds, in rank order.
        heads (tuple[int, int] | None): the model's attention and KV heads per
            layer. Default: ``None`` (not known).
    """

    world_size: int
    backend: str
    mode: str
    ranks: tuple[RankShare, ...]
    heads: tuple[int, int] | None = None

    def block(self) -> dict[str, Any]:
        """The ``distributed`` block: ``world_size``, ``backend``, ``mode`` and
        ``ranks``: each rank's ``weights_bytes``, ``layers`` and, when known,
        ``attention_heads`` and ``kv_heads`` (``[first, last]``, inclusive)."""
        ranks = []
        for share in self.ranks:
            entry: dict[str, Any] = {
                "rank": share.rank,
                "weights_bytes": share.weights_bytes,
                "layers": list(share.layers),
            }
            if share.attention_heads is not None:
                entry["attention_heads"] = list(share.attention_heads)
            if share.kv_heads is not None:
                entry["kv_heads"] = list(share.kv_heads)
            ranks.append(entry)
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "mode": self.mode,
            "ranks": ranks,
        }

    def lines(self) -> list[str]:
        """One start-up line per rank: what it holds."""
        return [f"mlxspec: rank {r.rank} holds {r.text(self.heads)}" for r in self.ranks]


def init_topology(backend: str, pipeline: bool) -> Topology:
    """Join the group the launcher prepared.

    Args:
        backend (str): from :func:`detect_launch`.
        pipeline (bool): split layers instead of heads (``--pipeline``).

    Returns:
        Topology: this process's place.

    Raises:
        RuntimeError: the backend could not start (MLX's message).
    """
    import mlx.core as mx

    return Topology(mx.distributed.init(strict=True, backend=backend), backend, pipeline)

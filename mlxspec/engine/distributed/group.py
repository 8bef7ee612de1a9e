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

    def gather_shares(self, local_bytes: int) -> tuple[int, ...]:
        """Every rank's weight bytes, in rank order (each rank passes its own).

        Every rank must call it at the same point (it is a collective).
        """
        slots = [0] * self.size
        slots[self.rank] = local_bytes
        return tuple(self.all_sum(slots))

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


@dataclass(frozen=True)
class GroupInfo:
    """What ``/stats`` and ``/fit`` show of the group.

    Args:
        world_size (int): processes in the group.
        backend (str): MLX's backend.
        mode (str): ``"tensor"`` or ``"pipeline"``.
        shares (tuple[int, ...]): each rank's weight bytes, in rank order.
    """

    world_size: int
    backend: str
    mode: str
    shares: tuple[int, ...]

    def block(self) -> dict[str, Any]:
        """The ``distributed`` block: ``world_size``, ``backend``, ``mode`` and
        ``ranks`` (each rank's ``weights_bytes`` and ``share``, a fraction of the sum)."""
        total = max(1, sum(self.shares))
        ranks = [
            {"rank": r, "weights_bytes": b, "share": round(b / total, 4)}
            for r, b in enumerate(self.shares)
        ]
        return {
            "world_size": self.world_size,
            "backend": self.backend,
            "mode": self.mode,
            "ranks": ranks,
        }


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

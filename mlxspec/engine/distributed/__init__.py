"""A model sharded over several processes with ``mx.distributed`` (issue 33).

Started by ``mlx.launch`` (or MPI, or a supervisor that sets MLX's variables), each
process loads only its shard of the weights (:mod:`.shards`: tensor parallel
through the model's ``shard()``, or a pipeline split with ``--pipeline``). Rank 0
serves HTTP; every rank runs the same engine loop (:mod:`mlxspec.engine.loop`),
fed through one seam, the loop's job source: :mod:`.lockstep` broadcasts each
loop turn's step plan (new requests, agreed cancellations, stop) from rank 0
with one small ``all_sum`` when nothing changed (an idle group meets at agreed
pauses). :mod:`.peers` notices at once that a rank exited (its ring connection
closed); :mod:`.watchdog` bounds how long rank 0 waits on a silent group; then
rank 0 answers 503 and exits. No transport of our own: every byte moves through
MLX's collectives.
"""

from mlxspec.engine.distributed.group import (
    GroupInfo,
    Topology,
    detect_launch,
    init_topology,
)
from mlxspec.engine.distributed.lockstep import FollowerJobs, GroupLost, LeaderJobs
from mlxspec.engine.distributed.watchdog import Watchdog

__all__ = [
    "FollowerJobs",
    "GroupInfo",
    "GroupLost",
    "LeaderJobs",
    "Topology",
    "Watchdog",
    "detect_launch",
    "init_topology",
]

"""A sharded engine's part in its group: the job source, the watchdog, the
failure, and what ``/stats`` and ``/fit`` show (the engine holds one of these)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

from mlxspec.engine.distributed.group import GroupInfo, RankShare, Topology
from mlxspec.engine.distributed.lockstep import (
    DEFAULT_TICK_S,
    Broadcast,
    FollowerJobs,
    LeaderJobs,
)
from mlxspec.engine.distributed.peers import PeerWatch, ring_addresses, ring_connections
from mlxspec.engine.distributed.watchdog import DEFAULT_TIMEOUT_S, Watchdog
from mlxspec.engine.loop.jobs import Generate, Job, JobSource

log = logging.getLogger("mlxspec.engine.distributed")


class ShardedServing:
    """This rank's part in serving a model sharded over the group.

    Args:
        topology (Topology): the group and this rank's place.
        info (GroupInfo): world size, backend, mode and each rank's weight bytes.
        timeout (float): seconds without a completed plan broadcast before the
            group is given up (:mod:`.watchdog`). Default: :data:`DEFAULT_TIMEOUT_S`.
        tick (float): the longest pause of an idle group between two plan
            broadcasts (:func:`~.lockstep.idle_pause`). Default: :data:`DEFAULT_TICK_S`.
        peers (PeerWatch | None): watches the ring's connections, so a process
            that exits is noticed at once (:mod:`.peers`). Default: ``None``.
    """

    def __init__(
        self,
        topology: Topology,
        info: GroupInfo,
        timeout: float = DEFAULT_TIMEOUT_S,
        tick: float = DEFAULT_TICK_S,
        peers: PeerWatch | None = None,
    ) -> None:
        self.topology, self.info = topology, info
        self.timeout, self.tick = timeout, tick
        self.broadcast = Broadcast(topology)
        self.leader_jobs: LeaderJobs | None = None
        self.source: LeaderJobs | FollowerJobs | None = None
        self.watchdog: Watchdog | None = None
        self.peers = peers
        #: Why the group was given up; ``None`` while it serves.
        self.failure: str | None = None
        self._lock = threading.Lock()
        self._listeners: list[Callable[[str], None]] = []

    @property
    def leader(self) -> bool:
        """Whether this is rank 0 (it serves HTTP)."""
        return self.topology.rank == 0

    def on_lost(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(reason)`` once when the group is given up (after the 503s)."""
        self._listeners.append(listener)

    def job_source(self, jobs: queue.Queue[Job], on_job: Callable[[Generate], None]) -> JobSource:
        """The engine loop's job source for this rank, with the watchdog started.

        Args:
            jobs (queue.Queue[Job]): the engine's queue (rank 0 broadcasts it).
            on_job (Callable[[Generate], None]): a follower's new request, before
                its loop sees it (the KV ledger's ``submit``).
        """
        if self.leader:
            self.leader_jobs = LeaderJobs(jobs, self.broadcast, self.lose, self.tick)
            self.source = self.leader_jobs
        else:
            self.source = FollowerJobs(self.broadcast, self.lose, on_job, self.tick)
        self.watchdog = Watchdog(self.broadcast, self.lose, self.timeout)
        self.broadcast.last_done = time.monotonic()
        self.watchdog.start()
        if self.peers is not None:
            self.peers.on_lost = self._peer_lost
            self.peers.start()
        source: JobSource = self.source
        return source

    def _peer_lost(self, reason: str) -> None:
        if self.source is None or not self.source.stopping:  # not the group's own end
            self.lose(reason)

    def check_now(self) -> bool:
        """Whether the group is lost, looking at the ring's connections now (a
        signal handler's question: ``mlx.launch`` sends SIGTERM to the other
        ranks once one exited); a closed one gives the group up here."""
        if self.failure is None and self.peers is not None:
            if (reason := self.peers.gone()) is not None:
                self._peer_lost(reason)
        return self.failure is not None

    @staticmethod
    def stream() -> AbstractContextManager[Any]:
        """A block whose MLX work runs on mlx-lm's ``generation_stream`` (the
        engine loop's, on a sharded server): one stream keeps every rank's
        collectives in the same order (:class:`~.lockstep.Broadcast`)."""
        import mlx.core as mx
        from mlx_lm.generate import generation_stream

        return mx.stream(generation_stream)

    def lose(self, reason: str) -> None:
        """Give the group up once (any thread): rank 0 answers every held
        request with a 503, then the listeners run (``/health``, the exit)."""
        with self._lock:
            if self.failure is not None:
                return
            self.failure = f"the sharded model is unavailable: {reason}"
        answered = self.leader_jobs.fail_all(self.failure) if self.leader_jobs else 0
        log.error(
            "rank %d: %s (%d requests answered 503)", self.topology.rank, self.failure, answered
        )
        for listener in self._listeners:
            listener(self.failure)

    def stop(self) -> None:
        """A clean shutdown: stop watching."""
        if self.watchdog is not None:
            self.watchdog.stop()
        if self.peers is not None:
            self.peers.stop()

    def block(self) -> dict[str, Any]:
        """``/stats``' ``distributed`` block: :meth:`GroupInfo.block`, the plan
        broadcasts (turns, collectives, mean ms) and ``healthy``."""
        block = {**self.info.block(), **self.broadcast.snapshot(), "healthy": self.failure is None}
        if self.failure is not None:
            block["failure"] = self.failure
        return block


def join_group(
    topology: Topology, model: Any, prompt_cache: Any, timeout: float = DEFAULT_TIMEOUT_S
) -> ShardedServing:
    """After every rank loaded its shard: exchange the shares, agree on the
    random seed and scale the prompt cache's byte counts (collectives: every
    rank calls it at the same point of its start-up).

    Args:
        topology (Topology): the group.
        model: this rank's shard (``nn.Module``).
        prompt_cache (PromptCache): the engine's; its entries count the whole
            model's bytes (``byte_scale``), so every rank evicts alike.
        timeout (float): the watchdog's bound, seconds.

    Returns:
        ShardedServing: this rank's part.
    """
    from mlxspec.engine.model.fit import model_memory

    mine = own_share(topology, model, model_memory(model).weights_bytes)
    ranks = tuple(RankShare.from_row(r, row) for r, row in enumerate(topology.gather(mine.row())))
    topology.agree_seed()
    if topology.pipeline:
        total = int(getattr(model.model, "num_hidden_layers", 0) or len(model.model.layers))
        prompt_cache.byte_scale = (total, max(1, len(model.layers)))
    else:
        prompt_cache.byte_scale = (topology.size, 1)
    mode = "pipeline" if topology.pipeline else "tensor"
    heads = _head_counts(model)
    info = GroupInfo(topology.size, topology.backend, mode, ranks, heads)
    peers = None
    if topology.backend == "ring":
        peers = PeerWatch(ring_connections(ring_addresses()), lambda reason: None)
    return ShardedServing(topology, info, timeout, peers=peers)


def _head_counts(model: Any) -> tuple[int, int] | None:
    """The model's attention and KV heads per layer (``args``), or ``None``."""
    args = getattr(model, "args", None)
    heads = getattr(args, "num_attention_heads", None)
    kv = getattr(args, "num_key_value_heads", None) or heads
    return (heads, kv) if isinstance(heads, int) and isinstance(kv, int) else None


def own_share(topology: Topology, model: Any, weights_bytes: int) -> RankShare:
    """What this rank holds: with ``--pipeline`` the layers mlx-lm's
    ``PipelineMixin.pipeline`` gave it (``start_idx``, ``end_idx``) and every
    head of them; in tensor mode every layer and a contiguous run of heads
    (``shard()`` splits each projection's rows into equal parts in rank order).

    Args:
        topology (Topology): the group.
        model: this rank's shard (``nn.Module``).
        weights_bytes (int): the bytes it loaded.
    """
    inner = getattr(model, "model", None)
    total = getattr(getattr(model, "args", None), "num_hidden_layers", None)
    total = total if isinstance(total, int) else len(getattr(inner, "layers", ()))
    heads = _head_counts(model)
    if topology.pipeline:
        start, end = int(getattr(inner, "start_idx", 0)), getattr(inner, "end_idx", None)
        layers = (start, (total if end is None else int(end)) - 1)
        every = None if heads is None else ((0, heads[0] - 1), (0, heads[1] - 1))
        return RankShare(topology.rank, weights_bytes, layers, *(every or (None, None)))
    if heads is None:
        return RankShare(topology.rank, weights_bytes, (0, total - 1))
    r, n = topology.rank, topology.size
    part = [(r * h // n, (r + 1) * h // n - 1) for h in heads]
    return RankShare(topology.rank, weights_bytes, (0, total - 1), part[0], part[1])

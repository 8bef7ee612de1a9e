"""``mlx.launch -n N -- mlxspec serve MODEL [--pipeline]``: one model over a group.

Each process of the group loads only its shard
(:mod:`mlxspec.engine.distributed`); rank 0 serves HTTP and every other rank
runs the same engine loop on rank 0's step plans until rank 0 stops it (exit 0)
or the group breaks (exit :data:`EXIT_GROUP_LOST`). What one rank alone cannot
do is refused here in one line before any model loads: a mounted adapter, a
draft source, the SSD cache tier and the byte budgets (each rank's memory
differs); at request time embeddings, decision scoring and ``/v1/adapters``
mounts are 400s (``NotShardableError``).
"""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
from collections.abc import Mapping

from mlxspec.config import ServeConfig

#: A process of the group was lost or stalled: the group must be restarted.
EXIT_GROUP_LOST = 4
#: Seconds rank 0 keeps answering (503s, ``/health``) after the group is lost
#: before it exits, so the answers already written reach their clients.
EXIT_GRACE_S = 2.0

log = logging.getLogger("mlxspec.cli.group")


def group_problem(config: ServeConfig, backend: str | None) -> str | None:
    """Why ``config`` cannot serve over the group ``backend`` names, or ``None``.

    Args:
        config (ServeConfig): the parsed flags.
        backend (str | None): :func:`~mlxspec.engine.distributed.detect_launch`'s answer.
    """
    if backend is None:
        return "--pipeline: needs a process group (start with mlx.launch -n N ...)"
    refused = [
        ("--adapter-path", config.adapter_path),
        ("--draft-model", config.draft_model),
        ("--draft-kind", config.draft_kind),
        ("--fill", config.fill == "strict"),
        ("--ssd-cache", config.ssd_cache),
        ("--memory-budget", config.memory_budget),
        ("--kv-budget", config.kv_budget),
        # every rank would start its own parent and children on one port
        ("--isolate", config.isolate),
        ("--unix", config.unix),
    ]
    for flag, value in refused:
        if value:
            return f"{flag} is not supported with a model sharded over processes (mlx.launch)"
    raw = os.environ.get("MLXSPEC_DIST_TIMEOUT", "")
    if raw and _seconds(raw) is None:
        return f"MLXSPEC_DIST_TIMEOUT={raw}: not a finite number of seconds above 0"
    return None


def _seconds(raw: str) -> float | None:
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and value > 0 else None


def group_timeout() -> float:
    """``MLXSPEC_DIST_TIMEOUT``: seconds the group may stall before rank 0
    gives it up (default 60; must exceed the longest model step)."""
    from mlxspec.engine.distributed.watchdog import DEFAULT_TIMEOUT_S

    raw = os.environ.get("MLXSPEC_DIST_TIMEOUT", "")
    value = _seconds(raw) if raw else None  # a bad value was refused by group_problem
    return DEFAULT_TIMEOUT_S if value is None else value


def exit_when_lost(engine) -> None:  # noqa: ANN001 - mlxspec.engine.Engine
    """Once the group is lost (on rank 0, after the 503s), exit
    :data:`EXIT_GROUP_LOST` after :data:`EXIT_GRACE_S`, so a supervisor
    (systemd, Kubernetes, ``mlx.launch``) restarts the group; the engine thread
    may be stuck inside a collective, so only an exit ends the process."""

    def lost(reason: str) -> None:
        print(f"mlxspec: error: {reason}; exiting", file=sys.stderr, flush=True)
        timer = threading.Timer(EXIT_GRACE_S, _exit, (EXIT_GROUP_LOST,))
        timer.daemon = True
        timer.start()

    engine.group.on_lost(lost)


def serve_follower(engine) -> int:  # noqa: ANN001 - mlxspec.engine.Engine
    """Run a follower rank's engine until rank 0 stops the group; returns the
    exit code (0, or :data:`EXIT_GROUP_LOST`). Prints one line with the
    outcomes it counted (the same as rank 0's ``/stats`` requests)."""
    group = engine.group
    exit_when_lost(engine)  # a stalled rank 0 must not keep this rank forever
    engine.wait()
    counts = " ".join(f"{k}={v}" for k, v in engine.counters.items())
    print(f"mlxspec: rank {group.topology.rank}: stopped; requests {counts}", flush=True)
    return 0 if group.failure is None else EXIT_GROUP_LOST


def join(config: ServeConfig, backend: str | None):  # noqa: ANN201 - Topology | int
    """Join the group the launcher prepared, or say why not.

    Args:
        config (ServeConfig): the parsed flags (``pipeline``).
        backend (str | None): the launcher's backend (``None``: ``--pipeline``
            without a launcher).

    Returns:
        Topology | int: this process's place, or the exit code (2) after one
        line on stderr.
    """
    from mlxspec.engine.distributed import init_topology

    if (problem := group_problem(config, backend)) is not None:
        if launch_rank() in (None, 0):  # every rank finds it: said once
            print(f"mlxspec: error: {problem}", file=sys.stderr)
        return 2
    assert backend is not None
    try:
        return init_topology(backend, config.pipeline)
    except RuntimeError as exc:
        print(f"mlxspec: error: cannot join the {backend} group: {exc}", file=sys.stderr)
        return 2


def launch_rank(env: Mapping[str, str] | None = None) -> int | None:
    """This process's rank as its launcher set it (before the group is joined),
    or ``None`` when no launcher's variable says (``MLX_RANK``; MPI's
    ``OMPI_COMM_WORLD_RANK`` or ``PMI_RANK``)."""
    env = os.environ if env is None else env
    for name in ("MLX_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if (value := env.get(name, "")).isdigit():
            return int(value)
    return None


def refused_on_every_rank(exc: BaseException) -> bool:
    """Whether a follower's load error is one every rank meets alike (the model
    cannot be split: :class:`~mlxspec.engine.distributed.shards.ShardError`),
    which rank 0 prints once; other errors (a file missing on one host) each
    rank prints with its rank."""
    from mlxspec.engine.distributed.shards import ShardError

    return isinstance(exc.__cause__, ShardError)


def _exit(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

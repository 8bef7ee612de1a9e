"""``GET /stats``, ``GET /fit`` and ``GET /metrics``: read-only views of the server.

They render the engine's plain snapshots and never touch MLX (no engine work,
no lock): ``/stats`` reports admission, batch, request and cache state
(``stats_snapshot``, ``fit_snapshot``, ``cache_stats``); ``/fit`` how the
model fits this machine and the decode rate its memory bandwidth allows;
``/metrics`` the Prometheus registry. ``response_store`` appears when the app
state holds one with ``stats()``.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

from connexion.context import scope
from starlette.responses import Response

from mlxspec import __version__
from mlxspec.engine import (
    FitSnapshot,
    ModelInfo,
    ModelMemory,
    StatsSnapshot,
    TranscriberProtocol,
)
from mlxspec.handlers.context import current_engine
from mlxspec.host import machine
from mlxspec.http.metrics import CONTENT_TYPE

#: Context at which ``/fit`` reports the typical decode rate (the reference's 8192).
TYPICAL_CONTEXT = 8192


async def get_stats() -> dict[str, Any]:
    """Server, admission, batch, request and cache state (reference ``GET /stats``);
    with a Whisper service, its ``transcription`` block."""
    transcriber: TranscriberProtocol | None = scope["state"].get("transcriber")
    if scope["state"].get("engine") is None and transcriber is not None:
        return transcription_only_stats(transcriber)
    engine = current_engine()
    stats, fit = engine.stats_snapshot(), engine.fit_snapshot()
    body = {
        "server": _server(engine.info),
        "admission": _admission(stats, fit),
        "batch": _batch(stats),
        "requests": {"submitted": stats.submitted, **stats.outcomes},
        "kv_quant": dict(fit.kv_quant),
        **engine.cache_stats(),
    }
    if stats.speculation is not None:
        body["speculation"] = stats.speculation
    if stats.fill is not None:
        body["fill"] = stats.fill
    if (group := engine.distributed_block()) is not None:
        body["distributed"] = group
    store = scope["state"].get("response_store")
    if callable(getattr(store, "stats", None)):
        body["response_store"] = store.stats()
    if transcriber is not None:
        body["transcription"] = _transcription(transcriber)
    return body


def _transcription(transcriber: TranscriberProtocol) -> dict[str, Any]:
    """The Whisper service's block, with its dictation sessions'."""
    block = dict(transcriber.block())
    sessions = scope["state"].get("transcription_sessions")
    if sessions is not None:
        block["sessions"] = sessions.block()
    return block


def transcription_only_stats(transcriber: TranscriberProtocol) -> dict[str, Any]:
    """``/stats`` of ``serve <whisper checkpoint>``: the server and its ``transcription``."""
    server = {
        "owner": "serve",
        "version": __version__,
        "model": transcriber.model_id,
        "started_at": transcriber.created,
        "uptime_s": round(max(0.0, time.time() - transcriber.created), 3),
    }
    return {"server": server, "transcription": _transcription(transcriber)}


def _server(info: ModelInfo) -> dict[str, Any]:
    return {
        "owner": "serve",
        "version": __version__,
        "model": info.id,
        "started_at": info.created,
        "uptime_s": round(max(0.0, time.time() - info.created), 3),
    }


def _admission(stats: StatsSnapshot, fit: FitSnapshot) -> dict[str, Any]:
    usable = _usable_bytes(fit)
    return {
        "max_queue": stats.max_queue,
        "queue_depth": stats.waiting,
        "in_flight": stats.in_flight,
        "rejected": stats.rejected,
        "max_safe_context": _max_safe_context(fit, usable),
        "enforced_context_tokens": stats.enforced_context,
        "memory_budget_bytes": fit.memory_budget,
        "usable_bytes": usable,
        "weights_bytes": fit.memory.weights_bytes,
    }


def _batch(stats: StatsSnapshot) -> dict[str, Any]:
    batched = stats.max_batch > 1
    return {
        "configured": stats.max_batch,
        "mode": "batch" if batched else "serial",
        "batched": batched,
        "active_rows": stats.running,
        "pending_rows": stats.waiting,
        "submitted_rows": stats.submitted,
        "kv_bytes": stats.kv_bytes,
        "kv_budget_bytes": stats.kv_budget_bytes,
        "steps": stats.steps,
        "solo_steps": stats.solo_steps,
    }


def _usable_bytes(fit: FitSnapshot) -> int:
    """Memory the model may use: the operator's budget, else the free device
    memory (GPU) or available RAM, plus the weights already resident in it."""
    if fit.memory_budget is not None:
        return int(fit.memory_budget)
    gpu = machine.gpu()
    if gpu is not None and gpu.free_bytes is not None:
        free = gpu.free_bytes
    else:
        free = machine.memory()[1] or 0
    return int(free) + fit.memory.weights_bytes


def _max_safe_context(fit: FitSnapshot, usable: int) -> int:
    """Tokens of context one request can use within ``usable`` bytes and the
    engine's context limit (window or operator cap)."""
    return min(fit.context_limit, fit.memory.context_for(usable))


async def get_fit() -> dict[str, Any]:
    """How the model fits this machine and the decode rate it predicts
    (reference ``GET /fit``; the Apple SKU matrix does not apply off macOS)."""
    engine = current_engine()
    gpu = machine.gpu()
    # The bandwidth probes take ~0.1 s the first time: off the event loop. A GPU
    # decodes from its own memory, measured with MLX where MLX work runs.
    group = engine.distributed_block()
    if gpu is not None and group is None:  # a sharded engine runs no work on rank 0 alone
        bandwidth = await engine.run_exclusive(machine.device_bandwidth_gbs)
        source = "device memory copy (MLX on the GPU)"
    else:
        bandwidth = await asyncio.to_thread(machine.bandwidth_gbs)
        source = "host memory copy (NumPy, one thread)"
    fit = engine.fit_snapshot()
    memory, usable = fit.memory, _usable_bytes(fit)
    context = _max_safe_context(fit, usable)
    typical = min(TYPICAL_CONTEXT, context)
    kv_bytes = memory.kv_bytes_per_token * context
    transient = memory.transient_bytes(usable)
    total, available = machine.memory()
    body = {
        "machine": {
            "cpu": machine.cpu_model(),
            "cpu_count": _cpu_count(),
            "ram_bytes": total,
            "available_bytes": available,
            "bandwidth_gbs": round(bandwidth, 2),
            "bandwidth_source": source,
            "gpu": None if gpu is None else gpu.__dict__.copy(),
        },
        "device": "gpu" if gpu is not None else "cpu",
        "vision": "vision" in engine.info.media,
        "audio": "audio" in engine.info.media,
        "context_tokens": context,
        "typical_context_tokens": typical,
        "typical_decode_tps": _decode_tps(bandwidth, memory, typical),
        "report": {
            "fits": context > 0,
            "weights_bytes": memory.weights_bytes,
            "kv_bytes_per_token": memory.kv_bytes_per_token,
            "kv_bytes": kv_bytes,
            "transient_bytes": transient,
            "total_bytes": memory.weights_bytes + kv_bytes + transient,
            "usable_bytes": usable,
            "max_safe_context": context,
            "predicted_decode_tps": _decode_tps(bandwidth, memory, context),
        },
    }
    if group is not None:  # the report is rank 0's shard; the block has every rank's
        body["distributed"] = group
    return body


def _decode_tps(bandwidth_gbs: float, memory: ModelMemory, context: int) -> float:
    """Memory-bound decode rate of one sequence: each token reads every weight
    and the KV cache of ``context`` tokens once."""
    return memory.decode_tps(bandwidth_gbs, context)


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


async def get_metrics() -> Response:
    """The app's Prometheus registry in the text exposition format 0.0.4."""
    return Response(scope["state"]["metrics"].render(), media_type=CONTENT_TYPE)

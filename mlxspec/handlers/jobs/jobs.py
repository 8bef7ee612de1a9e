"""``/api/jobs`` (operationIds ``listJobs``, ``getJob``, ``streamJob``,
``cancelJob``): jobs read from their rows and logs (reference, "Jobs"); the
cancel (``DELETE``) goes beyond the reference and kills the runner's process group.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from mlxspec.errors import ApiError
from mlxspec.handlers.context import JSON
from mlxspec.handlers.jobs.common import current_jobs
from mlxspec.http import sse
from mlxspec.jobs import TERMINAL, JobStore

#: The stream's reconnection time, ms (reference: ``retry: 1500``).
RETRY_MS = 1500
#: How often a stream reads a live job's log, seconds.
POLL_S = 0.25


async def list_jobs(limit: int = 50, kind: str | None = None) -> Any:
    """The most recent jobs, newest first: ``{"ok": true, "jobs": [JobRow, ...]}``."""
    rows = await asyncio.to_thread(current_jobs().store.recent, limit, kind)
    return {"ok": True, "jobs": [r.wire() for r in rows]}, 200, JSON


async def get_job(job_id: str) -> Any:
    """One job: ``{"ok": true, "job": JobRow}``.

    Raises:
        ApiError: 404 ``job not found``.
    """
    row = await asyncio.to_thread(current_jobs().store.get, job_id)
    if row is None:
        raise ApiError("not_found", "job not found")
    return {"ok": True, "job": row.wire()}, 200, JSON


async def cancel_job(job_id: str) -> Any:
    """End a queued or running job (``failed``, ``cancelled``), killing its
    runner's process group; a job that already ended is answered as it is.

    Raises:
        ApiError: 404 ``job not found``.
    """
    row = await asyncio.to_thread(current_jobs().cancel, job_id)
    if row is None:
        raise ApiError("not_found", "job not found")
    return {"ok": True, "job": row.wire()}, 200, JSON


async def stream_job(job_id: str) -> Any:
    """The SSE tail of a job's log: ``retry: 1500``, a ``data:`` frame per event,
    polling while the job is live, then ``event: end`` with ``data: {}``. An
    unknown id streams one ``failed`` event, then ``end``."""
    store = current_jobs().store
    return sse.event_stream(_frames(store, job_id))


async def _frames(store: JobStore, job_id: str) -> AsyncIterator[bytes]:
    yield sse.retry_frame(RETRY_MS)
    row = await asyncio.to_thread(store.get, job_id)
    if row is None:
        yield sse.data_frame({"type": "failed", "error": "job not found", "ts": time.time()})
        yield sse.named_frame("end", {})
        return
    offset, log_path, ended = 0, row.log_path, False
    while not ended:
        # The status is read before the log, so a terminal event is never missed.
        ended = row is None or row.status in TERMINAL
        events, offset = await asyncio.to_thread(store.read_events, log_path, offset)
        for event in events:
            yield sse.data_frame(event)
        if not ended:
            await asyncio.sleep(POLL_S)
            row = await asyncio.to_thread(store.get, job_id)
    yield sse.named_frame("end", {})

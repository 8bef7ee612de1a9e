"""``POST /admin/cache/session/close`` and ``POST /admin/cache/flush``
(operationIds ``closeCacheSession`` and ``flushCache``): prompt-cache
operations (reference, "POST /admin/cache/session/close", "POST /admin/cache/flush")."""

from __future__ import annotations

import asyncio
from typing import Any

from mlxspec.engine import FLUSH_TIMEOUT_S
from mlxspec.handlers.context import JSON, current_engine, request_headers
from mlxspec.handlers.requests import session_key


async def close_cache_session(body: dict[str, Any] | None = None) -> Any:
    """Forget a session's checkpoint association; its entries stay cached.

    The session is read as the generation routes read it (:func:`.requests.session_key`:
    body ``session_id``, ``prompt_cache_key``, then the affinity headers), so a
    client that labels its requests with a header closes the session the same way.
    ``closed`` says whether a session id was supplied, as the reference answers,
    not whether the session was known (sessions are process-local labels).
    """
    session = session_key(body or {}, request_headers())
    if session is None:
        return {"closed": False}, 200, JSON
    current_engine().close_cache_session(session)
    return {"closed": True}, 200, JSON


async def flush_cache() -> Any:
    """Write every pending SSD snapshot; 200 when all are durable, else 503
    with the counters that say why. Runs off the event loop (it waits on disk)."""
    report = await asyncio.to_thread(current_engine().flush_cache, FLUSH_TIMEOUT_S)
    return report, 200 if report["durable"] else 503, JSON

"""``POST /admin/drain`` and ``POST /admin/lease`` (operationIds ``drainWorker``
and ``holdLease``): the routes of a worker bound to a unix socket (``--unix``,
an ``--isolate`` child), never served on TCP (reference, route index,
"Internal routes"). The supervisor drains a worker before it stops it, so its
prompt cache survives on the SSD tier; a lease keeps the engine thread for
work outside the server (managed jobs) while its connection stays open.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from starlette.responses import StreamingResponse

from mlxspec.engine import FLUSH_TIMEOUT_S, EngineLease
from mlxspec.handlers.context import JSON, current_engine

#: The first (and only) line a held lease sends; the connection then stays open.
LEASE_LINE = b'{"leased":true}\n'


async def drain_worker() -> Any:
    """Quiesce the engine and demote its prompt cache to the SSD tier.

    Returns:
        ``{"drained": true, "demotions": N}``: ``N`` prompt-cache entries moved
        from RAM to the SSD tier (0 without ``--ssd-cache``).
    """
    demotions = await asyncio.to_thread(current_engine().drain, FLUSH_TIMEOUT_S)
    return {"drained": True, "demotions": demotions}, 200, JSON


async def hold_lease() -> Any:
    """Make the prompt cache durable, then hold the engine thread (no decode
    step, no other exclusive job runs) until the client closes the connection.

    Returns:
        a streamed ``application/jsonl`` answer: :data:`LEASE_LINE` once the
        lease is held, then nothing until the client leaves, which releases it.
    """
    engine = current_engine()
    await asyncio.to_thread(engine.flush_cache, FLUSH_TIMEOUT_S)
    lease = EngineLease(engine)
    await lease.acquire()

    async def body() -> AsyncIterator[bytes]:
        try:
            yield LEASE_LINE
            await asyncio.Event().wait()  # Starlette cancels this when the client leaves
        finally:
            await lease.release(wait_s=0)  # the client has gone: nothing to wait for

    return StreamingResponse(body(), media_type="application/jsonl")

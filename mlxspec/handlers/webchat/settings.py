"""``/api/settings/tool-approvals`` (operationIds ``getToolApprovals``,
``deleteToolApproval``): the web chat's always-allow list, read and forgotten
(reference, "Settings"). A tool joins the list only through an approval card
(the ``approval`` frame with ``alwaysAllow``), never through these routes.
"""

from __future__ import annotations

import asyncio
from typing import Any

from mlxspec.handlers.context import JSON
from mlxspec.handlers.webchat.tools.approvals import ApprovalList


async def get_tool_approvals() -> Any:
    """The always-allowed tools: ``{"ok": true, "alwaysAllow": [...]}``."""
    names = await asyncio.to_thread(ApprovalList().tools)
    return {"ok": True, "alwaysAllow": names}, 200, JSON


async def delete_tool_approval(body: dict[str, Any]) -> Any:
    """Forget ``body.tool`` (idempotent); returns the list as it is now."""
    names = await asyncio.to_thread(ApprovalList().remove, body["tool"])
    return {"ok": True, "alwaysAllow": names}, 200, JSON

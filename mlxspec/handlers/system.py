"""``GET /health`` and ``GET /v1`` (API index)."""

from __future__ import annotations

from typing import Any

from connexion.context import scope
from starlette.responses import Response

from mlxspec import __version__
from mlxspec.errors import ApiError
from mlxspec.handlers.context import current_engine
from mlxspec.openapi import served_spec


def _endpoints() -> list[str]:
    """``"METHOD /path"`` of every operation in the document, plus the document
    itself: read from the document, so the index cannot drift from it. The
    internal routes (a worker's ``/admin/drain`` and ``/admin/lease``, the
    ``--isolate`` parent's ``/engine``) are not part of the client contract and
    are not listed (reference, route index, "Internal routes")."""
    methods = ("get", "post", "put", "patch", "delete")
    paths = served_spec()["paths"]
    routes = [f"{m.upper()} {path}" for path, item in paths.items() for m in methods if m in item]
    return [*routes, "GET /openapi.json"]


ENDPOINTS = _endpoints()


HEALTH_BODY = b'{"status": "ok"}'


async def health() -> Any:
    """Exactly ``{"status": "ok"}``, byte for byte what mlx_lm.server sends; a
    transcription-only server adds its ``transcription`` block (the reference).
    A sharded server that lost a process of its group answers 503 ``engine_unavailable``."""
    state = scope["state"]
    if state.get("engine") is None and state.get("transcriber") is not None:
        return {"status": "ok", "transcription": state["transcriber"].block()}
    group = current_engine().distributed_block()
    if group is not None and not group["healthy"]:  # a rank is lost: the balancer moves on
        raise ApiError("group_unavailable", group["failure"])
    return Response(HEALTH_BODY, media_type="application/json")


async def api_index() -> dict[str, Any]:
    """Name, version, served model and the routes, for discovery tooling."""
    return {
        "name": "mlxspec",
        "version": __version__,
        "model": _served_id(),
        "endpoints": ENDPOINTS,
    }


def _served_id() -> str:
    """The chat model's id, or the Whisper model's on a transcription-only server."""
    state = scope["state"]
    if state.get("engine") is None and state.get("transcriber") is not None:
        return state["transcriber"].model_id
    return current_engine().info.id

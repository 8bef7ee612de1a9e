"""``GET /health`` and ``GET /v1`` (API index)."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from mlxspec import __version__
from mlxspec.handlers.context import current_engine
from mlxspec.openapi import load_spec


def _endpoints() -> list[str]:
    """``"METHOD /path"`` of every operation in the document, plus the document
    itself: read from the document, so the index cannot drift from it."""
    methods = ("get", "post", "put", "patch", "delete")
    paths = load_spec()["paths"]
    routes = [f"{m.upper()} {path}" for path, item in paths.items() for m in methods if m in item]
    return [*routes, "GET /openapi.json"]


ENDPOINTS = _endpoints()


HEALTH_BODY = b'{"status": "ok"}'


async def health() -> Response:
    """Exactly ``{"status": "ok"}``, byte for byte what mlx_lm.server sends."""
    return Response(HEALTH_BODY, media_type="application/json")


async def api_index() -> dict[str, Any]:
    """Name, version, served model and the routes, for discovery tooling."""
    return {
        "name": "mlxspec",
        "version": __version__,
        "model": current_engine().info.id,
        "endpoints": ENDPOINTS,
    }

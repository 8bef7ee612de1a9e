"""``GET /health`` and ``GET /v1`` (API index)."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from mlxspec import __version__

from .common import current_engine

ENDPOINTS = [
    "POST /v1/chat/completions",
    "POST /v1/completions",
    "POST /v1/responses",
    "GET /v1/responses/{response_id}",
    "POST /v1/messages",
    "POST /v1/messages/count_tokens",
    "POST /v1/embeddings",
    "POST /v1/decisions",
    "POST /v1/systemone",
    "GET /v1/models",
    "GET /v1/models/{model_id}",
    "GET /health",
    "GET /stats",
    "GET /fit",
    "GET /metrics",
    "GET /openapi.json",
]


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

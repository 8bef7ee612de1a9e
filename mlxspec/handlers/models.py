"""``GET /v1/models`` and ``GET /v1/models/{model_id}``."""

from __future__ import annotations

from typing import Any

from connexion.context import scope

from mlxspec.errors import ApiError
from mlxspec.handlers.context import current_engine
from mlxspec.parsers import detect


def _served_model() -> dict[str, Any]:
    """The served model's row with the reference's capability fields."""
    engine = current_engine()
    info, d = engine.info, engine.defaults
    vision, audio = "vision" in info.media, "audio" in info.media
    adapters = True  # LoRA adapters mount at run time on every chat model
    return {
        "id": info.id,
        "object": "model",
        "created": info.created,
        "owned_by": "mlxspec",
        "context_window": info.context_window,
        "reasoning": detect(engine.chat_format).reasoning is not None,
        "vision": vision,
        "audio": audio,
        "batch_mode": "batch" if engine.stats_snapshot().max_batch > 1 else "serial",
        "tools": True,
        "structured_output": True,
        "embeddings": info.embedding,
        "adapters": adapters,
        "training": False,
        "capabilities": {
            "chat_completions": True,
            "text_completions": True,
            "anthropic_messages": True,
            "responses": True,
            "streaming": True,
            "tools": True,
            "structured_output": True,
            "logprobs": True,
            "decisions": True,
            "embeddings": info.embedding,
            "vision": vision,
            "audio": audio,
            "adapters": adapters,
            "training": False,
        },
        "gen_defaults": {"temperature": d.temperature, "top_p": d.top_p, "top_k": d.top_k},
    }


def _adapter_models() -> list[dict[str, Any]]:
    """The mounted LoRA adapters as models whose ``parent`` is the served model
    (vLLM lists its LoRA modules this way; ``model: <id>`` selects one)."""
    engine = current_engine()
    info = engine.info
    return [
        {
            "id": a,
            "object": "model",
            "created": info.created,
            "owned_by": "mlxspec",
            "parent": info.id,
        }
        for a in engine.adapters.ids()
    ]


def _rows() -> list[dict[str, Any]]:
    """The served model first, its mounted adapters, then the Whisper model when
    one is configured (the reference lists its transcription companion beside the
    chat model); a transcription-only server lists the Whisper model alone."""
    state = scope["state"]
    transcriber = state.get("transcriber")
    chat = state.get("engine") is not None or transcriber is None
    rows = [_served_model(), *_adapter_models()] if chat else []
    if transcriber is not None:
        rows.append(
            {
                "id": transcriber.model_id,
                "object": "model",
                "created": transcriber.created,
                "owned_by": "mlxspec",
                "capabilities": {
                    "transcription": True,
                    "translation": not transcriber.model_id.endswith(".en"),
                    "chat_completions": False,
                },
            }
        )
    return rows


def _library_models(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every other servable chat model on disk (the library's scan: supported
    architectures, one row per repo), as the reference lists them after the
    served model: ``vision`` and ``tier``."""
    library = scope["state"].get("library")
    if library is None or scope["state"].get("engine") is None:
        return []
    return library.model_rows(rows, rows[0]["created"] if rows else 0)


async def list_models() -> dict[str, Any]:
    """The served model, its mounted adapters, the Whisper model, then every
    other servable model on disk, as an OpenAI list (``{"object": "list",
    "data": [...]}``)."""
    import asyncio

    rows = _rows()
    if "library" in scope["state"]:  # the scan (cached 30 s) reads folders: off the loop
        rows += await asyncio.to_thread(_library_models, rows)
    return {"object": "list", "data": rows}


async def retrieve_model(model_id: str) -> dict[str, Any]:
    """One ``Model`` object, OpenAI's shape (``client.models.retrieve``).

    The reference and mlx_lm.server answer the list shape here; the SDKs
    expect a model, so this follows OpenAI (docs/deviations.md).

    Raises:
        ApiError: 404 ``not_found`` for an id this server does not serve; for
            a path with a trailing slash (``/v1/models/``, ``/v1/models/<id>/``:
            the id is ``""`` or ends in ``/``) the message names the path
            without it (the server matches paths exactly, as the reference).
    """
    rows = _rows()
    row = next((r for r in rows if r["id"] == model_id), None) or rows[0]
    if model_id != row["id"]:
        if not model_id or model_id.endswith("/"):
            path = f"/v1/models/{model_id.rstrip('/')}".rstrip("/")
            message = f"not found: did you mean {path}? (no trailing slash)"
            raise ApiError("not_found", message, param="model_id")
        raise ApiError("not_found", f"model '{model_id}' not found", param="model_id")
    return row

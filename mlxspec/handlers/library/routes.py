"""Handlers of the model library's routes (see the package docstring).

The registry and the downloads live in the app state (``library``,
``downloads``: one per server). Domain refusals answer the reference's
``{"ok": false, "error": ...}`` with its status (400 for a path or repo id that
would leave the cache, 409 for a duplicate download); request shapes are the
OpenAPI document's.
"""

from __future__ import annotations

import asyncio
import shlex
from typing import Any

from connexion.context import scope

from mlxspec.library import (
    DownloadBusy,
    Downloads,
    PathRefused,
    Registry,
    check_repo_id,
    execute_gc,
    plan_gc,
    resolve_folder,
)
from mlxspec.library.downloads import MODEL_FILES
from mlxspec.library.hub import search

JSON = {"Content-Type": "application/json"}


def _registry() -> Registry:
    return scope["state"]["library"]


def _downloads() -> Downloads:
    return scope["state"]["downloads"]


def _refused(message: str, status: int = 400) -> tuple[dict[str, Any], int, dict[str, str]]:
    return {"ok": False, "error": message}, status, JSON


def _flag(value: str) -> bool:
    return value in ("1", "true")


def _serving() -> set[str]:
    engine = scope["state"].get("engine")
    return {engine.info.id} if engine is not None else set()


async def get_library(refresh: str = "0") -> dict[str, Any]:
    """Every model on disk with its fit assessment (reference ``GET /library``);
    cached 30 s, ``?refresh=1`` scans again."""
    rows = await asyncio.to_thread(_registry().library, _serving(), _flag(refresh))
    return {"models": rows}


async def get_downloads() -> dict[str, Any]:
    """The last five downloads, newest first (reference ``GET /downloads``)."""
    return {"downloads": _downloads().listing()}


async def hub_local(refresh: str = "0") -> dict[str, Any]:
    """``GET /api/hub/local``: the library's rows, ``ok`` added."""
    rows = await asyncio.to_thread(_registry().library, _serving(), _flag(refresh))
    return {"ok": True, "models": rows}


async def hub_search(q: str) -> dict[str, Any]:
    """``GET /api/hub/search?q=``: MLX models on the hub, or the offline state."""
    return await asyncio.to_thread(search, q)


async def hub_download(body: dict[str, Any]) -> Any:
    """``POST /api/hub/download``: start a background download; 409 while one
    of the same repo runs, 400 for a repo id that is not ``org/name``."""
    patterns = tuple(MODEL_FILES) + tuple(body.get("include") or ())
    try:
        _downloads().start(body["repo"], patterns)
    except PathRefused as exc:
        return _refused(str(exc))
    except DownloadBusy as exc:
        return _refused(str(exc), 409)
    return {"ok": True, "repo": body["repo"], "started": True}, 200, JSON


async def hub_serve(body: dict[str, Any]) -> Any:
    """``POST /api/hub/serve``: a single-model server cannot swap its model, so
    it answers ``restart_required`` with the exact command (the ``--isolate``
    parent answers this route itself and swaps its pool's default). 404 for a
    model that is not a servable model on disk, 400 for a malformed id."""
    model = body["model"]
    row = await asyncio.to_thread(_find, model)
    if row is None or not row.chat:
        try:
            check_repo_id(model)
        except PathRefused as exc:
            return _refused(str(exc))
        return _refused(f"{model} is not a servable model on disk: download it first", 404)
    target = row.repo_id if row.source == "hf-cache" else row.path
    return {
        "ok": False,
        "restart_required": True,
        "command": f"mlxspec serve {shlex.quote(target)}",
    }


def _find(model: str) -> Any:
    """The library row of ``model``, scanning again when the cached scan lacks it."""
    registry = _registry()
    found = registry.find(model)
    if found is None:
        registry.snapshot(refresh=True)
        found = registry.find(model)
    return found


async def gc_plan() -> dict[str, Any]:
    """``GET /api/gc/plan``: what a GC would delete (deletes nothing)."""
    plan = await asyncio.to_thread(plan_gc)
    return plan.json()


async def gc_execute(body: dict[str, Any]) -> Any:
    """``POST /api/gc/execute``: ``{"yes": true}`` deletes what a fresh plan names."""
    if body.get("yes") is not True:
        return _refused('{"yes": true} is required to delete anything; see GET /api/gc/plan')
    result = await asyncio.to_thread(execute_gc)
    _registry().invalidate()
    return result, 200, JSON


async def resolve_model_folder(body: dict[str, Any]) -> Any:
    """``POST /api/model/resolve-folder``: a picked folder as a servable path,
    inside the caches only."""
    try:
        found = await asyncio.to_thread(
            resolve_folder, body.get("folder_name"), body.get("rel_path")
        )
    except PathRefused as exc:
        return _refused(str(exc))
    return found, 200, JSON

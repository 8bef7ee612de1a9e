"""``/v1/adapters`` (operationIds ``listAdapters``, ``listAvailableAdapters``,
``mountAdapter``, ``unmountAdapter``): LoRA hot-swap (reference, "Adapters (LoRA
hot-swap)").

Mounting and unmounting run on the engine thread between decode steps
(``Engine.run_exclusive``); reading folders and scanning directories run off the
event loop. ``POST`` reads a directory the client names: with ``--adapter-dirs``
only paths inside those directories are read (403 otherwise).
"""

from __future__ import annotations

import asyncio
from typing import Any

from connexion.context import scope

from mlxspec.engine import find_adapters, inside, read_folder, scan_dirs
from mlxspec.errors import ApiError
from mlxspec.handlers.context import JSON, current_engine


async def list_adapters() -> Any:
    """The mounted adapters."""
    return {"adapters": current_engine().adapters.listing()}, 200, JSON


async def list_available_adapters() -> Any:
    """Every adapter folder in the scanned directories (``--adapter-dirs``'
    among them), mounted or not."""
    registry = current_engine().adapters
    allowed = _adapter_dirs()
    folders = await asyncio.to_thread(lambda: find_adapters(scan_dirs(allowed=allowed)))
    return {"adapters": [registry.describe(f) for f in folders]}, 200, JSON


async def mount_adapter(body: dict[str, Any]) -> Any:
    """Mount the folder ``body.path`` as ``body.id``, all or nothing.

    Raises:
        ApiError: 403 ``adapter_path_not_allowed`` for a path outside ``--adapter-dirs``.
        AdapterLimitError: ``--max-adapters`` are mounted (429).
        AdapterDuplicateError: another id holds the same weights (409).
        AdapterError: a folder that is not an adapter or does not fit (400).
    """
    engine = current_engine()
    adapter_id, path = body["id"], body["path"]
    allowed = _adapter_dirs()
    if not await asyncio.to_thread(inside, path, allowed):
        raise ApiError(
            "adapter_path_not_allowed",
            f"adapter path {path} is outside --adapter-dirs ({', '.join(allowed)})",
            param="path",
        )
    folder = await asyncio.to_thread(read_folder, path)
    mounted = await engine.run_exclusive(lambda: engine.adapters.mount(adapter_id, folder))
    return mounted, 200, JSON


async def unmount_adapter(adapter_id: str) -> Any:
    """Unmount ``adapter_id``; requests running with it finish with its weights.

    Raises:
        ApiError: 404 when it is not mounted.
    """
    engine = current_engine()
    removed = await engine.run_exclusive(lambda: engine.adapters.unmount(adapter_id))
    if removed is None:
        raise ApiError("not_found", f"adapter {adapter_id} not mounted", param="adapter_id")
    return {"id": adapter_id, "removed_layers": removed}, 200, JSON


def _adapter_dirs() -> tuple[str, ...]:
    """``--adapter-dirs`` of the serving app (``()``: any readable path)."""
    return scope["state"]["config"].adapter_dirs

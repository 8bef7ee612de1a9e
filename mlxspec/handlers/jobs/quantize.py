"""``/api/quantize/*`` (operationIds ``inspectQuantize``, ``submitQuantize``,
``resolveFolder``; reference, "Quantize"): the submit starts a quantize job
(:mod:`mlxspec.jobs.quantize`) whose output is a synthetic repo in the HF cache."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from mlxspec.errors import ApiError
from mlxspec.handlers.context import JSON
from mlxspec.handlers.jobs.common import confine, current_jobs
from mlxspec.jobs import hf_hub_cache, mlxspec_cache
from mlxspec.jobs.quantize import inspect_model, output_repo, resolve_model

NOT_FOUND = "Couldn't locate this folder on disk — paste the path instead."


def _model_folder(model_id: str) -> Path | None:
    """A model id's folder: a path (confined: 400 outside the roots) or a repo in the cache."""
    if model_id.startswith(("/", "~", ".")) or Path(model_id).expanduser().is_dir():
        return resolve_model(str(confine(model_id, "model_id")))
    return resolve_model(model_id)


async def inspect_quantize(body: dict[str, Any]) -> Any:
    """Whether the quantizer can walk a model: ``{ok, model_id, arch, support,
    size_gb}`` (+ ``error``), 200 either way."""
    folder = _model_folder(body["model_id"])
    return await asyncio.to_thread(inspect_model, body["model_id"], folder), 200, JSON


async def submit_quantize(body: dict[str, Any]) -> Any:
    """Start a quantize job: ``{"ok": true, "job_id", "output_dir", "repo_id"}``
    (``output_dir``: the repo's folder in the HF cache; the snapshot is the ``done``
    event's ``output_dir``).

    Raises:
        ApiError: 400 when the model is not found (a folder in the roots, or a
            repo in the HF cache).
    """
    folder = _model_folder(body["model_id"])
    if folder is None:
        raise ApiError("invalid_request", f"model {body['model_id']!r} not found", param="model_id")
    stored = {**body, "model_path": str(folder), "repo_id": output_repo(body["model_id"], body)}
    repo_dir = hf_hub_cache() / f"models--{stored['repo_id'].replace('/', '--')}"
    row = current_jobs().submit("quantize", stored, str(repo_dir), {})
    answer = {"ok": True, "job_id": row.id, "output_dir": str(repo_dir)}
    return {**answer, "repo_id": stored["repo_id"]}, 200, JSON


def _repo_id(folder: Path) -> str | None:
    """``org/name`` of the ``models--org--name`` folder ``folder`` is or lies in."""
    repo = next((p for p in (folder, *folder.parents) if p.name.startswith("models--")), None)
    return repo.name[len("models--") :].replace("--", "/") if repo else None


def _resolve(name: str | None, rel: str | None) -> dict[str, Any]:
    for base in (hf_hub_cache(), mlxspec_cache()):
        candidates = [base / rel] if rel else []
        if name:
            candidates.append(base / name)
            candidates.extend(base.glob(f"models--*/snapshots/{Path(name).name}"))
        for found in candidates:
            try:
                inside = found.resolve().is_relative_to(base.resolve())
            except (OSError, RuntimeError):
                continue
            if not inside or not found.is_dir():
                continue
            repo_id = _repo_id(found)
            path = (
                resolve_model(repo_id) if found.name.startswith("models--") and repo_id else found
            )
            if path is None or not (path / "config.json").is_file():
                continue
            answer: dict[str, Any] = {"ok": True, "path": str(path)}
            if repo_id:
                answer["repo_id"] = repo_id
            try:
                answer["model_type"] = json.loads((path / "config.json").read_text())["model_type"]
            except (OSError, ValueError, KeyError):
                pass
            return answer
    return {"ok": False, "error": NOT_FOUND}


async def resolve_folder(body: dict[str, Any]) -> Any:
    """A folder the browser picked (``models--org--name``, a snapshot hash, a bare
    model folder under the hub cache or mlxspec's cache) as a servable path:
    ``{ok, path, repo_id?, model_type?}`` or ``{ok: false, error}``, 200 either way."""
    answer = await asyncio.to_thread(_resolve, body.get("folder_name"), body.get("rel_path"))
    return answer, 200, JSON

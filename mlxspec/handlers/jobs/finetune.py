"""``/api/finetune/*`` (operationIds ``submitFinetune``, ``inspectDataset``,
``mergeAdapters``, ``exportAdapter``; reference, "Fine-tune"): the submit starts a
fine-tune job (:mod:`mlxspec.jobs.finetune` maps its fields; a field it cannot
honour fails the job, not the request), the others answer at once."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from typing import Any

from mlxspec.errors import ApiError
from mlxspec.handlers.context import JSON
from mlxspec.handlers.jobs.common import confine, current_jobs
from mlxspec.jobs import JobRoots
from mlxspec.jobs.datasets import inspect_folder

#: The path fields of a ``FinetuneSubmit``, confined to the jobs' roots.
PATH_FIELDS = ("model_dir", "data_dir", "adapter_path", "warm_start_adapter")


async def submit_finetune(body: dict[str, Any]) -> Any:
    """Start a fine-tune job: ``{"ok": true, "job_id", "adapter_path"}``.

    ``adapter_path`` defaults to ``<mlxspec cache>/adapters/adapter-<timestamp>``.

    Raises:
        ApiError: 400 for a path outside the jobs' roots (the document answers a
            missing ``model_dir``/``data_dir`` with ``model_dir and data_dir required``).
    """
    stored = dict(body)
    if not stored.get("adapter_path"):
        stored["adapter_path"] = str(JobRoots.default_output("adapters", "adapter"))
    for field in PATH_FIELDS:
        if stored.get(field):
            stored[field] = str(confine(stored[field], field))
    row = current_jobs().submit("finetune", stored, stored["adapter_path"], {})
    return {"ok": True, "job_id": row.id, "adapter_path": stored["adapter_path"]}, 200, JSON


async def inspect_dataset(body: dict[str, Any]) -> Any:
    """Probe a data folder: ``{ok, n_train, n_valid, format}`` (+ ``error``,
    ``bad_lines`` naming broken lines by number); 200 either way."""
    folder = confine(body["path"], "path")
    report = await asyncio.to_thread(inspect_folder, folder)
    return report.wire(), 200, JSON


async def merge_adapters(body: dict[str, Any]) -> Any:
    """Fold two LoRA adapters into one under ``<mlxspec cache>/adapters/merged-<ts>``
    (:mod:`mlxspec.jobs.merge`, in a subprocess).

    Raises:
        ApiError: 400 ``{ok: false, error}`` for a path outside the roots or a
            failed merge (not LoRA folders, shapes that disagree).
    """
    a, b = confine(body["adapter_a"], "adapter_a"), confine(body["adapter_b"], "adapter_b")
    scales = body.get("scales")
    out = JobRoots.default_output("adapters", "merged")
    argv = [sys.executable, "-m", "mlxspec.jobs.merge", str(a), str(b), str(out)]
    argv += [str(s) for s in scales] if scales else ["-", "-"]
    done = await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or ["merge failed"]
        raise ApiError("invalid_request", f"merge failed: {lines[-1]}")
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    return {"ok": True, "merged_path": str(out), "stats": stats}, 200, JSON


async def export_adapter(body: dict[str, Any]) -> Any:
    """Write ``manifest.json`` describing an adapter into
    ``<mlxspec cache>/exports/export-<timestamp>``: ``{ok, export_path, manifest}``.

    Raises:
        ApiError: 400 for an adapter path outside the roots or not a folder.
    """
    adapter = confine(body["adapter_path"], "adapter_path")
    if not (adapter / "adapter_config.json").is_file():
        raise ApiError(
            "invalid_request", f"adapter_path {str(adapter)!r} holds no adapter_config.json"
        )
    manifest: dict[str, Any] = {"version": 1, "base_model": body["base_model"]}
    manifest["adapter_path"] = str(adapter)
    if body.get("method"):
        manifest["method"] = body["method"]
    manifest["created_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    out = JobRoots.default_output("exports", "export")
    out.mkdir(parents=True)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return {"ok": True, "export_path": str(out), "manifest": manifest}, 200, JSON

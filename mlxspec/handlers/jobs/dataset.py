"""``/api/dataset/*`` (operationIds ``listDatasetTemplates``, ``submitDataset``;
reference, "Dataset"): the template registry, and a template run as a job
(:mod:`mlxspec.jobs.dataset`); LLM-backed templates call this server's ``/v1``."""

from __future__ import annotations

from typing import Any

from mlxspec.errors import ApiError
from mlxspec.handlers.context import JSON
from mlxspec.handlers.jobs.common import confine, current_jobs, runner_env
from mlxspec.jobs import JobRoots
from mlxspec.jobs.dataset import TEMPLATES, template


async def list_dataset_templates() -> Any:
    """``{"templates": [...]}``: each template's id, label, output format, whether
    it needs the LLM, and its form fields."""
    return {"templates": TEMPLATES}, 200, JSON


async def submit_dataset(body: dict[str, Any]) -> Any:
    """Run a template as a job: ``{"ok": true, "job_id", "output_dir"}``.

    Raises:
        ApiError: 400 ``unknown template '<id>'``, or an input path outside the roots.
    """
    entry = template(body["template_id"])
    if entry is None:
        raise ApiError("invalid_request", f"unknown template {body['template_id']!r}")
    inputs = dict(body.get("inputs") or {})
    if isinstance(inputs.get("path"), str) and inputs["path"]:
        inputs["path"] = str(confine(inputs["path"], "inputs.path"))
    out = JobRoots.default_output("datasets", f"dataset-{entry['id']}")
    stored = {**body, "inputs": inputs, "output_dir": str(out)}
    env = runner_env() if entry["needs_llm"] else {}
    row = current_jobs().submit("dataset", stored, str(out), env)
    return {"ok": True, "job_id": row.id, "output_dir": str(out)}, 200, JSON

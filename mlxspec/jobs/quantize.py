"""The quantize job and its helpers (reference, "Quantize"): a model quantized
with ``mlx_lm.convert``, written into the Hugging Face hub cache as a synthetic
repo ``mlxspec/<name>-<suffix>`` (``models--mlxspec--<name>-<suffix>``: blobs,
``snapshots/<revision>`` linking to them, ``refs/main``), so
``huggingface_hub.scan_cache_dir`` lists it and ``mlxspec serve mlxspec/<name>-<suffix>``
loads it. ``<suffix>`` is ``<bits>bit``, or the mlx-lm mixed-precision recipe
(``mixed-3-6``: 3-bit layers with the sensitive ones at 6). The reference's
calibrated OptiQ knobs (``target_bpw``, ``candidate_bits``, ``reference``,
``calibration_mix``, ``n_calibration``, ``rotate_weights``) have no mlx-lm
counterpart and are refused by name.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from mlxspec.jobs.roots import hf_hub_cache
from mlxspec.jobs.runner import Emit, JobRefused

__all__ = [
    "BITS", "GROUP_SIZES", "RECIPES", "inspect_model", "output_repo", "resolve_model",
    "run_quantize", "write_synthetic_repo",
]  # fmt: skip

#: Bit widths and group sizes ``mlx.core.quantize`` takes (affine mode).
BITS = (2, 3, 4, 5, 6, 8)
GROUP_SIZES = (32, 64, 128)
#: mlx-lm's mixed-precision recipes (``mlx_lm.convert.QUANT_RECIPES``).
RECIPES = ("mixed_2_6", "mixed_3_4", "mixed_3_6", "mixed_4_6")
#: Reference fields with no mlx-lm counterpart (refused unless absent).
REFUSED = ("target_bpw", "candidate_bits", "reference", "calibration_mix", "n_calibration")


def resolve_model(model_id: str) -> Path | None:
    """A model folder for ``model_id``: an existing folder, else a repo id's
    snapshot in the hub cache (``refs/main``); ``None`` when neither."""
    folder = Path(model_id).expanduser()
    if folder.is_dir():
        return folder.resolve()
    if model_id.count("/") != 1:
        return None
    repo = hf_hub_cache() / f"models--{model_id.replace('/', '--')}"
    try:
        revision = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    snapshot = repo / "snapshots" / revision
    return snapshot if snapshot.is_dir() else None


def inspect_model(model_id: str, folder: Path | None) -> dict[str, Any]:
    """Whether the quantizer can walk a model (``POST /api/quantize/inspect``).

    Returns:
        dict: ``{ok, model_id, arch, support, size_gb}`` and ``error`` when it
        cannot: not found, no ``config.json``, an architecture mlx-lm does not
        know, or weights already quantized.
    """
    body: dict[str, Any] = {"ok": False, "model_id": model_id, "arch": None, "support": False}
    body["size_gb"] = 0.0
    if folder is None:
        return {**body, "error": f"model {model_id!r} not found (a folder, or a repo in the cache)"}
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return {**body, "error": f"{folder} has no readable config.json"}
    arch = config.get("model_type")
    size = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    body.update(arch=arch, size_gb=round(size / 1e9, 6))
    if not isinstance(arch, str) or importlib.util.find_spec(f"mlx_lm.models.{arch}") is None:
        return {**body, "error": f"architecture {arch!r} is not one mlx-lm can load"}
    if "quantization" in config:
        return {**body, "error": "the model is already quantized"}
    return {**body, "ok": True, "support": True}


def output_repo(model_id: str, body: dict[str, Any]) -> str:
    """The synthetic repo id: ``mlxspec/<name>-<bits>bit`` or ``-<recipe>``."""
    name = Path(model_id.rstrip("/")).name if "/" in model_id else model_id
    if name.startswith("models--"):  # a hub folder given by path
        name = name.split("--")[-1]
    if len(name) == 40 and all(c in "0123456789abcdef" for c in name):  # a snapshot folder
        name = "model"
    recipe = body.get("recipe")
    suffix = recipe.replace("_", "-") if recipe else f"{int(body.get('bits') or 4)}bit"
    return f"mlxspec/{name}-{suffix}"


def write_synthetic_repo(source: Path, repo_id: str, cache: Path | None = None) -> Path:
    """Move a model folder's files into the hub cache as ``repo_id``'s new revision.

    Each file becomes ``blobs/<sha256>``, linked from ``snapshots/<revision>/<name>``
    (the revision: 40 hex digits from the files' hashes and the time), and
    ``refs/main`` names the revision (huggingface_hub's cache layout).

    Args:
        source (Path): the folder (flat); emptied.
        repo_id (str): ``org/name``.
        cache (Path | None): the hub cache. Default: :func:`hf_hub_cache`.

    Returns:
        Path: the snapshot folder.
    """
    repo = (cache or hf_hub_cache()) / f"models--{repo_id.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    hashes = {}
    for file in sorted(p for p in source.iterdir() if p.is_file()):
        digest = hashlib.sha256()
        with file.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
        hashes[file.name] = digest.hexdigest()
        blob = repo / "blobs" / hashes[file.name]
        if not blob.exists():
            shutil.move(str(file), blob)
    stamp = json.dumps(hashes, sort_keys=True) + str(time.time_ns())
    revision = hashlib.sha1(stamp.encode()).hexdigest()
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for name, sha in hashes.items():
        os.symlink(Path("..", "..", "blobs", sha), snapshot / name)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def run_quantize(body: dict[str, Any], emit: Emit) -> tuple[str, dict[str, Any]]:
    """Run a quantize job (in the runner process).

    Args:
        body (dict): the stored submit body: ``model_id``, ``model_path`` (its
            resolved folder), ``bits``, ``group_size``, ``recipe``.
        emit (Emit): the job's event sink.

    Returns:
        tuple[str, dict]: the snapshot folder and ``{repo_id, bits, group_size,
        recipe, size_gb}``.

    Raises:
        JobRefused: a refused field, a bit width or group size mlx cannot
            quantize with, or an unknown recipe.
    """
    for name in REFUSED:
        if body.get(name) not in (None, [], ""):
            raise JobRefused(f"{name} is not supported (mlx_lm.convert has no calibrated search)")
    if body.get("rotate_weights"):
        raise JobRefused("rotate_weights is not supported by mlx_lm.convert")
    bits, group = int(body.get("bits") or 4), int(body.get("group_size") or 64)
    recipe = body.get("recipe")
    if bits not in BITS or group not in GROUP_SIZES or (recipe and recipe not in RECIPES):
        raise JobRefused(f"bits {BITS}, group_size {GROUP_SIZES}, recipe {RECIPES}")
    from mlx_lm.convert import convert

    repo_id = body["repo_id"]
    emit({"type": "stage", "stage": "quantize", "progress": 0.1, "message": f"{repo_id}"})
    cache = hf_hub_cache()
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".mlxspec-quantize-") as tmp:
        out = Path(tmp) / "model"
        convert(
            body["model_path"], str(out), quantize=True, q_group_size=group, q_bits=bits,
            quant_predicate=recipe,
        )  # fmt: skip
        emit({"type": "stage", "stage": "write", "progress": 0.9, "message": "into the HF cache"})
        snapshot = write_synthetic_repo(out, repo_id, cache)
    size = sum(p.stat().st_size for p in snapshot.glob("*.safetensors"))
    summary = {"repo_id": repo_id, "bits": bits, "group_size": group, "recipe": recipe}
    summary["size_gb"] = round(size / 1e9, 6)
    return str(snapshot), summary

"""Adapter folders on disk, as ``mlx_lm.lora`` saves them, read without MLX.

A folder holds ``adapter_config.json`` (``fine_tune_type``, ``num_layers``,
``lora_parameters`` with ``rank`` and ``scale``, and the base ``model`` it was
trained on) and ``adapters.safetensors``. This module reads the config, finds
adapters under the directories ``GET /v1/adapters/available`` scans, compares
an adapter's recorded base model with the served one, and decides whether a
path lies inside the directories ``--adapter-dirs`` allows.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxspec.engine.adapters.spec import AdapterError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapters.safetensors"
#: Directories scanned besides ``<cache>/adapters``, ``os.pathsep``-separated.
DIRS_ENV = "MLXSPEC_ADAPTER_DIRS"


@dataclass(frozen=True)
class AdapterFolder:
    """What an adapter folder says about itself.

    Args:
        path (Path): the folder, resolved.
        config (dict): ``adapter_config.json`` as read.
        fine_tune_type (str): ``lora``, ``dora`` or ``full``.
        rank (int | None): LoRA rank (``lora_parameters.rank``).
        scale (float | None): LoRA scale (``lora_parameters.scale``).
        base_model (str | None): the model it was trained on (``base_model``,
            else mlx_lm.lora's ``model``), ``None`` if not recorded.
        size_bytes (int): bytes of ``adapters.safetensors`` on disk.
    """

    path: Path
    config: dict[str, Any]
    fine_tune_type: str
    rank: int | None
    scale: float | None
    base_model: str | None
    size_bytes: int


def read_folder(path: str | Path, param: str = "path") -> AdapterFolder:
    """Read an adapter folder's config and weight file size.

    Args:
        path (str | Path): the folder.
        param (str): the request field named in errors. Default: ``"path"``.

    Returns:
        AdapterFolder: the folder's description.

    Raises:
        AdapterError: the folder, its config or its weights are missing or
            unreadable, or the config is not an mlx-lm LoRA adapter's.
    """
    folder = Path(path).expanduser()
    config_path, weights = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    try:
        if not folder.is_dir():
            raise AdapterError(f"adapter path {folder} is not a directory", param)
        for required in (config_path, weights):
            if not required.is_file():
                raise AdapterError(f"adapter path {folder} has no {required.name}", param)
        size = weights.stat().st_size
    except AdapterError:
        raise
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte, no permission
        raise AdapterError(
            f"adapter path {str(path)[:200]!r} cannot be read: {exc}", param
        ) from exc
    try:
        config = json.loads(config_path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise AdapterError(f"{config_path} is not readable JSON: {exc}", param) from exc
    if not isinstance(config, dict):
        raise AdapterError(f"{config_path} is not a JSON object", param)
    lora = config.get("lora_parameters")
    lora = lora if isinstance(lora, dict) else {}
    base = config.get("base_model") or config.get("model")
    return AdapterFolder(
        path=folder.resolve(),
        config=config,
        fine_tune_type=str(config.get("fine_tune_type", "lora")),
        rank=_number(lora.get("rank"), int),
        scale=_number(lora.get("scale"), float),
        base_model=str(base) if base else None,
        size_bytes=size,
    )


def _number(value: Any, kind: type) -> Any:
    return kind(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def bare_name(model: str) -> str:
    """A model's bare repo name, compared case-blind: ``org/Name`` and
    ``/path/to/Name`` are ``name``."""
    return model.rstrip("/").rsplit("/", 1)[-1].lower()


def compatible(folder: AdapterFolder, served: str) -> bool:
    """Whether the adapter's recorded base model is the served one (by bare
    repo name), or it recorded none (reference: ``compatible``)."""
    return folder.base_model is None or bare_name(folder.base_model) == bare_name(served)


def scan_dirs(
    environ: dict[str, str] | None = None, allowed: Sequence[str | Path] = ()
) -> list[Path]:
    """The directories ``GET /v1/adapters/available`` scans: ``adapters`` in
    mlxspec's cache folder (``MLXSPEC_CACHE_DIR``, else ``~/.cache/mlxspec``),
    then each of :data:`DIRS_ENV`'s entries, then each of ``allowed``
    (``--adapter-dirs``), in order, without repeats.

    Args:
        environ (dict | None): the environment. Default: ``None`` (``os.environ``).
        allowed (Sequence[str | Path]): ``--adapter-dirs``. Default: ``()``.

    Returns:
        list[Path]: the directories (missing ones included: the scan skips them).
    """
    from mlxspec.engine.model.loader import cache_dir

    environ = dict(os.environ) if environ is None else environ
    extra = [Path(p).expanduser() for p in environ.get(DIRS_ENV, "").split(os.pathsep) if p]
    mounted_from = [Path(p).expanduser() for p in allowed]
    return list(dict.fromkeys([cache_dir() / "adapters", *extra, *mounted_from]))


def find_adapters(dirs: Iterable[Path]) -> list[AdapterFolder]:
    """Every adapter folder in ``dirs``: each directory itself if it is one, and
    its immediate subdirectories that are; unreadable ones, and symbolic links to
    folders outside the scanned directory (which a mount under ``--adapter-dirs``
    refuses), are skipped.

    Args:
        dirs (Iterable[Path]): the directories to scan (missing ones are skipped).

    Returns:
        list[AdapterFolder]: each once, sorted by folder name (the id a listing
        shows), then by path, so the order does not hang on where the scanned
        directories live.
    """
    found: dict[Path, AdapterFolder] = {}
    for root in dirs:
        candidates = [root]
        try:
            real_root = root.resolve()
            candidates += sorted(p for p in root.iterdir() if p.is_dir())
        except (OSError, RuntimeError):
            continue
        for candidate in candidates:
            if not (candidate / CONFIG_FILE).is_file():
                continue
            try:
                folder = read_folder(candidate)
            except AdapterError:
                continue
            if not folder.path.is_relative_to(real_root):
                continue  # a link out of the directory: --adapter-dirs would refuse its mount
            found.setdefault(folder.path, folder)
    return [found[p] for p in sorted(found, key=lambda p: (p.name, str(p)))]


def inside(path: str | Path, roots: Sequence[str | Path]) -> bool:
    """Whether ``path`` (symbolic links resolved) lies in one of ``roots``
    (``--adapter-dirs``); any path when ``roots`` is empty."""
    if not roots:
        return True
    try:
        target = Path(path).expanduser().resolve()
    except (OSError, ValueError, RuntimeError):  # unresolvable: not inside anything
        return False
    return any(target.is_relative_to(Path(root).expanduser().resolve()) for root in roots)

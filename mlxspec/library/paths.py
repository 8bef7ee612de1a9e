"""Where the caches are, and the one check every client-named path passes.

A repo id or folder a client sends names something inside the Hugging Face hub
cache or mlxspec's cache, never anything else: :func:`check_repo_id` and
:func:`resolve_folder` refuse ``..``, absolute paths and names that would leave
the cache with :class:`PathRefused` (the handlers' 400).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

#: A Hugging Face repo id, ``org/name`` (huggingface_hub's ``validate_repo_id``:
#: letters, digits, ``-``, ``_``, ``.``; no ``--`` or ``..``; at most 96 characters).
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}$")
#: A commit hash, the name of a snapshot folder.
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
#: resolve-folder's answer for a folder that is not found (reference wording).
NOT_FOUND = "Couldn't locate this folder on disk — paste the path instead."


class PathRefused(ValueError):
    """A repo id or path that is malformed or would leave the caches (a 400)."""


def hub_cache_dir() -> Path:
    """The hub cache now: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (read per call, so a test may point elsewhere)."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


def mlxspec_cache_dir() -> Path:
    """mlxspec's cache: ``$MLXSPEC_CACHE_DIR``, else ``~/.cache/mlxspec`` (the loader's rule)."""
    configured = os.environ.get("MLXSPEC_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "mlxspec"


def check_repo_id(repo_id: object) -> str:
    """``repo_id`` if it is a plain ``org/name`` id.

    Raises:
        PathRefused: not a string, ``..`` or ``--`` in it, an absolute path,
            or any other shape than ``org/name``.
    """
    if not isinstance(repo_id, str) or not repo_id:
        raise PathRefused("repo id required: 'org/name'")
    if ".." in repo_id or "--" in repo_id or not REPO_ID_RE.match(repo_id):
        raise PathRefused(f"invalid repo id {repo_id!r}: expected 'org/name'")
    return repo_id


def repo_folder(repo_id: str, root: Path | None = None) -> Path:
    """The hub cache folder of model repo ``repo_id`` (``models--org--name``).

    Raises:
        PathRefused: ``repo_id`` fails :func:`check_repo_id`.
    """
    check_repo_id(repo_id)
    return (root or hub_cache_dir()) / ("models--" + repo_id.replace("/", "--"))


def _safe_name(value: object, what: str) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise PathRefused(f"{what} must be a string")
    if value.startswith(("/", "\\", "~")) or re.match(r"^[A-Za-z]:", value):
        raise PathRefused(f"{what} must be relative to the model cache, not an absolute path")
    if any(part == ".." for part in re.split(r"[\\/]", value)) or "\0" in value:
        raise PathRefused(f"{what} may not contain '..'")
    return value.strip("/")


def _inside(path: Path, roots: list[Path]) -> bool:
    real = path.resolve()
    return any(real == r.resolve() or real.is_relative_to(r.resolve()) for r in roots)


def _snapshot(repo_dir: Path) -> Path | None:
    """The snapshot ``refs/main`` names, else the newest one."""
    ref = repo_dir / "refs" / "main"
    if ref.is_file():
        commit = ref.read_text().strip()
        if COMMIT_RE.match(commit) and (repo_dir / "snapshots" / commit).is_dir():
            return repo_dir / "snapshots" / commit
    snaps = sorted((repo_dir / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime)
    return snaps[-1] if snaps else None


def resolve_folder(folder_name: object = None, rel_path: object = None) -> dict[str, Any]:
    """Turn a folder a browser picked into a servable path (reference, "Quantize",
    ``/api/model/resolve-folder``): a ``models--org--name`` hub folder, a snapshot
    hash folder, or a model folder directly under the hub cache or mlxspec's
    cache; ``rel_path`` (a path relative to one of those caches) wins over
    ``folder_name``. Only ``config.json`` is read.

    Returns:
        dict: ``{"ok": True, "path", "repo_id"?, "model_type"?}``, or
        ``{"ok": False, "error": NOT_FOUND}``.

    Raises:
        PathRefused: an absolute path or ``..`` (nothing outside the caches).
    """
    name, rel = _safe_name(folder_name, "folder_name"), _safe_name(rel_path, "rel_path")
    hub, own = hub_cache_dir(), mlxspec_cache_dir()
    roots = [hub, own]
    candidates: list[Path] = []
    for text in (rel, name):
        if text is None:
            continue
        head = text.split("/")[0]
        if head.startswith("models--"):
            candidates.append(hub / text)
        elif COMMIT_RE.match(head):
            candidates += sorted(hub.glob(f"models--*/snapshots/{text}"))
        else:
            candidates += [hub / text, own / text, own / "gguf" / text]
    for found in candidates:
        try:
            if found.name.startswith("models--") and found.parent == hub:
                found = _snapshot(found) or found
            usable = found.is_dir() and _inside(found, roots) and (found / "config.json").is_file()
        except (OSError, ValueError):  # a name too long, an unreadable folder
            continue
        if usable:
            return {"ok": True, "path": str(found), **_describe(found, hub)}
    if name is None and rel is None:
        raise PathRefused("folder_name or rel_path required")
    return {"ok": False, "error": NOT_FOUND}


def _describe(folder: Path, hub: Path) -> dict[str, Any]:
    import json

    out: dict[str, Any] = {}
    try:
        rel = folder.relative_to(hub).parts
        if rel and rel[0].startswith("models--"):
            out["repo_id"] = rel[0].removeprefix("models--").replace("--", "/", 1)
    except ValueError:
        pass
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
        if isinstance(model_type, str):
            out["model_type"] = model_type
    except (OSError, ValueError, AttributeError):
        pass
    return out

"""Disk reclaimed from the hub cache: superseded snapshots and the blobs only they link.

A snapshot no ``refs/*`` file names is superseded (a repo with no ref at all
keeps its newest snapshot). One whose files are all in a kept snapshot is
pruned; one holding a file no kept snapshot has is *skipped* (the reference:
"needs --force", not deletable here). What is deleted is
``huggingface_hub``'s ``HFCacheInfo.delete_revisions`` strategy for the pruned
snapshots: their snapshot folders and each blob no surviving snapshot links.
:func:`execute_gc` recomputes the plan and deletes exactly what it names (the
reference: "deletes exactly what a fresh plan would show").
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxspec.library.paths import check_repo_id, hub_cache_dir


@dataclass(frozen=True)
class RepoPlan:
    """One repo's part of a plan (the reference's ``superseded`` row)."""

    repo_id: str
    prune_snapshots: int
    skipped_snapshots: int
    dead_blobs: int
    reclaim_bytes: int
    strategy: Any = field(compare=False, repr=False)

    def json(self) -> dict[str, Any]:
        """The row as ``/api/gc/plan`` answers it."""
        return {
            "repo_id": self.repo_id,
            "prune_snapshots": self.prune_snapshots,
            "skipped_snapshots": self.skipped_snapshots,
            "dead_blobs": self.dead_blobs,
            "reclaim_bytes": self.reclaim_bytes,
        }


@dataclass(frozen=True)
class GcPlan:
    """What a GC deletes: one :class:`RepoPlan` per repo with superseded snapshots."""

    repos: tuple[RepoPlan, ...]

    @property
    def reclaim_bytes(self) -> int:
        """Bytes freed, summed over the repos."""
        return sum(r.reclaim_bytes for r in self.repos)

    def json(self) -> dict[str, Any]:
        """``GET /api/gc/plan``'s body."""
        return {
            "ok": True,
            "superseded": [r.json() for r in self.repos],
            "reclaim_bytes": self.reclaim_bytes,
        }

    def paths(self) -> list[Path]:
        """Every path the plan deletes (snapshot folders and blobs), sorted."""
        found: set[Path] = set()
        for r in self.repos:
            found |= set(r.strategy.blobs) | set(r.strategy.snapshots)
        return sorted(found)


def _scan(root: Path | None) -> Any:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    try:
        return scan_cache_dir(root or hub_cache_dir())
    except CacheNotFound:
        return None


def plan_gc(root: Path | None = None) -> GcPlan:
    """The plan for the hub cache at ``root`` (default: :func:`~.paths.hub_cache_dir`).
    Reads the cache's folders and links only, deletes nothing."""
    info = _scan(root)
    if info is None:
        return GcPlan(())
    plans = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        revisions = sorted(repo.revisions, key=lambda r: r.last_modified)
        kept = [r for r in revisions if r.refs] or revisions[-1:]
        kept_names = {f.file_name for r in kept for f in r.files}
        superseded = [r for r in revisions if r not in kept]
        prune = [r for r in superseded if {f.file_name for f in r.files} <= kept_names]
        if not superseded:
            continue
        strategy = info.delete_revisions(*(r.commit_hash for r in prune)) if prune else None
        plans.append(
            RepoPlan(
                repo.repo_id,
                len(prune),
                len(superseded) - len(prune),
                len(strategy.blobs) if strategy else 0,
                strategy.expected_freed_size if strategy else 0,
                _Empty() if strategy is None else strategy,
            )
        )
    return GcPlan(tuple(plans))


class _Empty:
    """A strategy that deletes nothing (a repo whose superseded snapshots are all skipped)."""

    blobs: frozenset = frozenset()
    snapshots: frozenset = frozenset()
    expected_freed_size = 0

    def execute(self) -> None:
        """Nothing to delete."""


def execute_gc(root: Path | None = None) -> dict[str, Any]:
    """Compute a fresh plan and delete exactly what it names.

    Returns:
        dict: ``{"ok": True, "snapshots", "blobs", "reclaimed_bytes"}`` (the
        reference's ``POST /api/gc/execute`` body).
    """
    plan = plan_gc(root)
    for repo in plan.repos:
        repo.strategy.execute()
    return {
        "ok": True,
        "snapshots": sum(r.prune_snapshots for r in plan.repos),
        "blobs": sum(r.dead_blobs for r in plan.repos),
        "reclaimed_bytes": plan.reclaim_bytes,
    }


def remove_repo(repo_id: str, root: Path | None = None) -> int:
    """Delete a model repo from the hub cache (``mlxspec rm``).

    Returns:
        int: bytes freed (the repo's size on disk).

    Raises:
        PathRefused: ``repo_id`` is not a plain ``org/name``.
        FileNotFoundError: the cache holds no such model repo.
    """
    check_repo_id(repo_id)
    info = _scan(root)
    repo = next(
        (
            r
            for r in (info.repos if info else ())
            if r.repo_id == repo_id and r.repo_type == "model"
        ),
        None,
    )
    if repo is None:
        raise FileNotFoundError(f"{repo_id} is not in the hub cache")
    size = int(repo.size_on_disk)
    shutil.rmtree(repo.repo_path)
    return size

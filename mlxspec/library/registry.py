"""The scan kept for 30 seconds, and the rows the routes answer.

The reference caches ``/library`` for 30 s (a registry scan plus config reads);
``refresh`` bypasses it, and a finished download or a GC invalidates it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxspec.library.assess import Assessment, Machine, assess, current_machine
from mlxspec.library.scan import LocalModel, scan

#: Seconds a scan answers before the next one (reference: "cached for 30 seconds").
TTL_S = 30.0


@dataclass(frozen=True)
class Snapshot:
    """One scan and its assessments, as of ``taken`` (``time.monotonic``)."""

    rows: tuple[LocalModel, ...]
    assessments: tuple[Assessment | None, ...]
    taken: float


def row_json(row: LocalModel, found: Assessment | None, serving: bool) -> dict[str, Any]:
    """A ``/library`` row in the reference's fields (``serving`` and ``source``,
    ``path`` added by mlxspec are documented in the OpenAPI document)."""
    return {
        "repo_id": row.repo_id,
        "model_type": row.model_type,
        "size_bytes": row.size_bytes,
        "quant_bits": row.quant_bits,
        "quant_group_size": row.quant_group_size,
        "vision": row.vision,
        "audio": row.audio,
        "supported": row.supported,
        "support_tier": row.support_tier,
        "serving": serving,
        "source": row.source,
        "assessment": None if found is None else found.__dict__.copy(),
    }


class Registry:
    """The library's cached scan.

    Args:
        hub (Path | None): the hub cache. Default: read from the environment per scan.
        own (Path | None): mlxspec's cache. Default: likewise.
        machine (Callable[[], Machine]): what rows are assessed against.
            Default: :func:`~.assess.current_machine`.
        ttl (float): seconds a scan is kept. Default: :data:`TTL_S`.
    """

    def __init__(
        self,
        hub: Path | None = None,
        own: Path | None = None,
        machine: Callable[[], Machine] = current_machine,
        ttl: float = TTL_S,
    ) -> None:
        self.hub, self.own, self.machine, self.ttl = hub, own, machine, ttl
        self._lock = threading.Lock()
        self._snapshot: Snapshot | None = None

    def snapshot(self, refresh: bool = False) -> Snapshot:
        """The scan, taken again when ``refresh``, invalidated or older than the TTL."""
        with self._lock:
            now = time.monotonic()
            snap = self._snapshot
            if refresh or snap is None or now - snap.taken > self.ttl:
                rows = tuple(scan(self.hub, self.own))
                machine = self.machine()
                snap = Snapshot(rows, tuple(assess(r, machine) for r in rows), now)
                self._snapshot = snap
            return snap

    def invalidate(self) -> None:
        """Forget the scan (after a download or a GC)."""
        with self._lock:
            self._snapshot = None

    def rows(self, refresh: bool = False) -> tuple[LocalModel, ...]:
        """The models on disk (:func:`~.scan.scan`)."""
        return self.snapshot(refresh).rows

    def find(self, repo_id: str) -> LocalModel | None:
        """The row of ``repo_id``, or ``None``."""
        return next((r for r in self.rows() if r.repo_id == repo_id), None)

    def library(self, serving: Collection[str] = (), refresh: bool = False) -> list[dict[str, Any]]:
        """``/library``'s rows; ``serving`` names the ids this server has loaded."""
        snap = self.snapshot(refresh)
        return [
            row_json(r, a, r.repo_id in serving or r.path in serving)
            for r, a in zip(snap.rows, snap.assessments, strict=True)
        ]

    def servable(self) -> list[LocalModel]:
        """Chat models mlxspec can serve (supported architectures, one per repo):
        ``/v1/models``' rows after the served model."""
        return [r for r in self.rows() if r.chat]

    def model_rows(self, listed: list[dict[str, Any]], created: int) -> list[dict[str, Any]]:
        """``/v1/models`` rows of :meth:`servable` models not in ``listed`` (the
        served or pooled rows before them), as the reference lists them after the
        served model: ``vision`` and ``tier``; ``created`` (Unix seconds) on each."""
        ids = {r["id"] for r in listed}
        return [
            {
                "id": m.repo_id,
                "object": "model",
                "created": created,
                "owned_by": "mlxspec",
                "vision": m.vision,
                "tier": m.support_tier,
            }
            for m in self.servable()
            if m.repo_id not in ids
        ]

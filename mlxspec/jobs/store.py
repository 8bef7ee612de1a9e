"""The jobs' durable state: one SQLite row per job and one NDJSON event log per job.

The row (stdlib ``sqlite3``, WAL, so the server and the runner processes read and
write it at once) holds what ``GET /api/jobs`` lists (reference, "Jobs"): kind,
status (``queued | running | done | failed | zombie``), the submit body as stored,
progress, message, paths, error and times, plus the runner's process-group id. The
log is append-only, one JSON event a line (``started``, ``log``, ``stage``,
``metric``, ``done``, ``failed``); every reader (the SSE tail, the row's progress)
reads it, none asks the runner. :meth:`JobStore.emit` appends an event and folds it
into the row in one call, so the row never disagrees with its log.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

__all__ = ["KINDS", "STATUSES", "TERMINAL", "JobRow", "JobStore", "pid_alive"]

#: What a job does (reference, "Jobs": ``kind``).
KINDS = ("quantize", "finetune", "dataset")
#: A job's life: queued, running, then done or failed; ``zombie`` is a job whose
#: runner died with the server (found at the next start).
STATUSES = ("queued", "running", "done", "failed", "zombie")
#: Statuses a job never leaves.
TERMINAL = frozenset({"done", "failed", "zombie"})

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    status TEXT NOT NULL,
    config_json TEXT NOT NULL,
    progress REAL NOT NULL DEFAULT 0,
    message TEXT,
    log_path TEXT NOT NULL,
    output_path TEXT,
    error TEXT,
    created REAL NOT NULL,
    started_at TEXT,
    ended_at TEXT,
    pgid INTEGER,
    owner INTEGER
)
"""


def _iso(ts: float | None = None) -> str:
    """An ISO 8601 UTC time stamp (seconds)."""
    moment = datetime.fromtimestamp(time.time() if ts is None else ts, UTC)
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class JobRow:
    """One job as ``GET /api/jobs/{id}`` answers it (reference, "Jobs").

    Args:
        id (str): the job id (32 hex digits).
        kind (str): one of :data:`KINDS`.
        status (str): one of :data:`STATUSES`.
        config_json (str): the submit body as stored (JSON text).
        progress (float): 0..1, from the latest ``stage`` or ``metric`` event.
        message (str | None): the latest stage's message.
        log_path (str): the NDJSON event log.
        output_path (str | None): what the job writes.
        error (str | None): why it failed.
        started_at (str): ISO time the job was submitted (the reference's field name).
        ended_at (str | None): ISO time it ended.
        pgid (int | None): the runner's process group while it runs (not on the wire).
        owner (int | None): the pid of the server that runs the job (not on the wire).
    """

    id: str
    kind: str
    status: str
    config_json: str
    progress: float
    message: str | None
    log_path: str
    output_path: str | None
    error: str | None
    started_at: str
    ended_at: str | None
    pgid: int | None
    owner: int | None

    def wire(self) -> dict[str, Any]:
        """The row's JSON shape (``JobRow`` in the OpenAPI document)."""
        return {k: v for k, v in self.__dict__.items() if k not in ("pgid", "owner")}

    @property
    def config(self) -> dict[str, Any]:
        """The stored submit body."""
        return dict(json.loads(self.config_json))


class JobStore:
    """The jobs table and the event logs, under one folder.

    Args:
        root (Path): the folder; ``jobs.sqlite3`` and ``logs/<id>.ndjson`` live in it
            (created, mode 0700).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        (self.root / "logs").mkdir(parents=True, exist_ok=True, mode=0o700)
        self.db_path = self.root / "jobs.sqlite3"
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute(_SCHEMA)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        db = sqlite3.connect(self.db_path, timeout=30, isolation_level=None)
        db.row_factory = sqlite3.Row
        try:
            yield db
        finally:
            db.close()

    def create(self, kind: str, config: dict[str, Any], output_path: str | None) -> JobRow:
        """A new ``queued`` job storing ``config``.

        Raises:
            ValueError: ``kind`` is not one of :data:`KINDS`.
        """
        if kind not in KINDS:
            raise ValueError(f"unknown job kind {kind!r}")
        job_id = uuid.uuid4().hex
        log_path = self.root / "logs" / f"{job_id}.ndjson"
        log_path.touch(mode=0o600)
        with self._db() as db:
            db.execute(
                "INSERT INTO jobs (id, kind, status, config_json, log_path, output_path,"
                " created, started_at, owner) VALUES (?, ?, 'queued', ?, ?, ?, ?, ?, ?)",
                (job_id, kind, json.dumps(config), str(log_path), output_path, time.time(), _iso())
                + (os.getpid(),),
            )
        row = self.get(job_id)
        assert row is not None
        return row

    def get(self, job_id: str) -> JobRow | None:
        """The job ``job_id``, or ``None``."""
        with self._db() as db:
            found = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return _row(found) if found else None

    def recent(self, limit: int = 50, kind: str | None = None) -> list[JobRow]:
        """The ``limit`` most recent jobs (of ``kind`` when given), newest first."""
        query, args = "SELECT * FROM jobs", []
        if kind:
            query, args = query + " WHERE kind = ?", [kind]
        query += " ORDER BY created DESC LIMIT ?"
        with self._db() as db:
            return [_row(r) for r in db.execute(query, (*args, limit)).fetchall()]

    def set_pgid(self, job_id: str, pgid: int | None) -> None:
        """Record (or clear) the runner's process group."""
        with self._db() as db:
            db.execute("UPDATE jobs SET pgid = ? WHERE id = ?", (pgid, job_id))

    def emit(self, job_id: str, event: dict[str, Any]) -> None:
        """Append ``event`` to the job's log and fold it into its row.

        ``started`` makes the job ``running``; ``stage`` and ``metric`` move its
        progress and message; ``done`` and ``failed`` end it (a job already ended
        is not changed, its log still grows).

        Args:
            job_id (str): the job.
            event (dict): a JobEvent (``type`` plus its fields); ``ts`` is added
                to ``started``, ``done`` and ``failed`` when missing (Unix seconds).
        """
        kind = event.get("type")
        if kind in ("started", "done", "failed"):
            event = {**event, "ts": event.get("ts", time.time())}
        row = self.get(job_id)
        if row is None:
            raise KeyError(job_id)
        if row.status in TERMINAL:  # the terminal event stays the log's last
            return
        with open(row.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps(event, ensure_ascii=False) + "\n")
        updates: dict[str, Any] = {}
        if kind == "started":
            updates["status"] = "running"
        elif kind == "stage":
            updates["message"] = event.get("message") or event.get("stage")
            if isinstance(event.get("progress"), (int, float)):
                updates["progress"] = float(event["progress"])
        elif kind == "metric" and isinstance(event.get("progress"), (int, float)):
            updates["progress"] = float(event["progress"])
        elif kind == "done":
            updates.update(status="done", progress=1.0, ended_at=_iso(), pgid=None)
            if event.get("output_dir"):
                updates["output_path"] = event["output_dir"]
        elif kind == "failed":
            updates.update(status="failed", error=str(event.get("error")), ended_at=_iso())
            updates["pgid"] = None
        if updates:
            self._update(job_id, updates, only_live="status" in updates)

    def mark_zombie(self, job_id: str) -> None:
        """End a job whose runner died with the server: ``zombie``, with an error,
        and a ``failed`` event in its log (so a stream of it ends like any other)."""
        row = self.get(job_id)
        if row is None:
            return
        error = "the server stopped while this job ran (zombie)"
        with open(row.log_path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"type": "failed", "error": error, "ts": time.time()}) + "\n")
        self._update(job_id, {"status": "zombie", "error": error, "ended_at": _iso(), "pgid": None})

    def live(self) -> list[JobRow]:
        """The jobs still ``queued`` or ``running``."""
        with self._db() as db:
            found = db.execute("SELECT * FROM jobs WHERE status IN ('queued', 'running')")
            return [_row(r) for r in found.fetchall()]

    def _update(self, job_id: str, values: dict[str, Any], only_live: bool = False) -> None:
        sets = ", ".join(f"{k} = ?" for k in values)
        where = "id = ?" + (" AND status IN ('queued', 'running')" if only_live else "")
        with self._db() as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE {where}", (*values.values(), job_id))

    @staticmethod
    def read_events(log_path: str, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """The whole events of ``log_path`` from byte ``offset`` on.

        A last line still being written (no newline yet) is left for the next
        read; a line that is not JSON is skipped.

        Returns:
            tuple[list[dict], int]: the events and the offset after them.
        """
        try:
            with open(log_path, "rb") as log:
                log.seek(offset)
                data = log.read()
        except OSError:
            return [], offset
        end = data.rfind(b"\n") + 1
        events = []
        for line in data[:end].splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
        return events, offset + end


def _row(found: sqlite3.Row) -> JobRow:
    values = {k: found[k] for k in found.keys() if k != "created"}
    return JobRow(**values)


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` still exists and has not exited (a zombie waiting
    to be reaped counts as gone: Linux's ``/proc/<pid>/stat`` state ``Z``)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): the signal check is all there is
    return stat.rpartition(")")[2].split()[:1] != ["Z"]

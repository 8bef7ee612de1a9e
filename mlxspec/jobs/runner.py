"""A job's runner process: ``python -m mlxspec.jobs.runner STORE_DIR JOB_ID SERVER_PID``.

Started by :class:`~mlxspec.jobs.manager.JobManager` in a process group of its
own (the manager has emitted ``started``). It reads the job's stored config, runs the kind's work
(:mod:`.finetune`, :mod:`.quantize`, :mod:`.dataset`; each takes the config and an
``emit`` callable and returns ``(output_dir, summary)``), then leaves its terminal
event, ``done`` or ``failed`` with the reason (:class:`JobRefused`'s message names
the field at fault), in a result file: the manager emits it after the last line
of the runner's output, so it stays the last event of the log. It dies with its
server: a thread watches the parent process and kills the group when the server
is gone, so no runner outlives it unseen.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mlxspec.jobs.store import JobStore

__all__ = ["Emit", "JobRefused", "main", "result_path"]

#: A kind's way to add an event to its job's log.
Emit = Callable[[dict[str, Any]], None]


class JobRefused(Exception):
    """The job's config cannot run as asked (its ``failed`` event says why)."""


def _watch_parent(parent: int) -> None:
    """Kill this process group once the server (``parent``) is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _work(kind: str) -> Callable[[dict[str, Any], Emit], tuple[str, dict[str, Any]]]:
    if kind == "finetune":
        from mlxspec.jobs.finetune import run_finetune

        return run_finetune
    if kind == "quantize":
        from mlxspec.jobs.quantize import run_quantize

        return run_quantize
    from mlxspec.jobs.dataset import run_dataset

    return run_dataset


def main(argv: list[str]) -> int:
    """Run the job ``argv[1]`` of the store in ``argv[0]`` for the server whose
    pid is ``argv[2]``; the exit status is 0 when it is done, 1 when it failed."""
    _watch_parent(int(argv[2]))  # gone already (it died while this one started): killed
    store = JobStore(Path(argv[0]))
    job_id = argv[1]
    row = store.get(job_id)
    if row is None:
        print(f"no job {job_id}", file=sys.stderr)
        return 2

    def emit(event: dict[str, Any]) -> None:
        store.emit(job_id, event)

    try:
        output_dir, summary = _work(row.kind)(row.config, emit)
        end: dict[str, Any] = {"type": "done", "output_dir": output_dir, "summary": summary}
    except JobRefused as e:
        end = {"type": "failed", "error": str(e)}
    except Exception as e:
        traceback.print_exc()
        end = {"type": "failed", "error": f"{type(e).__name__}: {e}"}
    # The manager emits it once this process's output is all in the log.
    result_path(store, job_id).write_text(json.dumps(end))
    return 0 if end["type"] == "done" else 1


def result_path(store: JobStore, job_id: str) -> Path:
    """Where a runner leaves its terminal event for the manager."""
    return store.root / "logs" / f"{job_id}.result.json"


if __name__ == "__main__":
    # The module's own copy, so the kinds' JobRefused is the one main catches.
    from mlxspec.jobs.runner import main as _main

    sys.exit(_main(sys.argv[1:]))

"""Runs jobs: a runner subprocess per job, in its own process group, one
accelerator job at a time under the engine's execution lease.

A submitted job is a ``queued`` row (:mod:`.store`). Its task waits for its turn:
a job that uses the accelerator (fine-tune, quantize) first takes the manager's
lock (one such job at a time), then the engine's execution lease
(``EngineProtocol.run_exclusive`` holding the engine thread, as ``POST
/admin/lease`` does), so serving and training never overlap on the accelerator;
a dataset job (which may call this server's own ``/v1``) takes neither. The
runner (``python -m mlxspec.jobs.runner``) writes the job's events itself; its
stdout and stderr become ``log`` events, and its terminal event (left in a result
file) is emitted after its last output line. A runner that exits without one
ends ``failed``; ``DELETE`` kills its process group. At start, a job whose
server is gone is ``zombie`` (it was running) or ``failed`` (it never started),
and a runner it left behind is killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from mlxspec.engine.lease import EngineLease
from mlxspec.jobs.roots import JobRoots, mlxspec_cache
from mlxspec.jobs.runner import result_path
from mlxspec.jobs.store import TERMINAL, JobRow, JobStore, pid_alive

__all__ = ["LEASE_KINDS", "JobManager"]

log = logging.getLogger(__name__)

#: Job kinds that use the accelerator, and so hold the engine's lease.
LEASE_KINDS = frozenset({"finetune", "quantize"})
#: Longest ``log`` line kept, characters.
MAX_LOG_LINE = 2000
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class JobManager:
    """Submits, runs, cancels and sweeps jobs.

    Args:
        roots (JobRoots): where job paths may lie.
        engine: the served engine (``run_exclusive`` gives the lease), or ``None``
            (no lease to take).
        store_dir (Path | None): the table and logs. Default: ``None``
            (``<mlxspec cache>/jobs``).
    """

    def __init__(self, roots: JobRoots, engine: Any, store_dir: Path | None = None) -> None:
        self.roots, self.engine = roots, engine
        self.store = JobStore(store_dir or mlxspec_cache() / "jobs")
        self._accelerator: asyncio.Lock | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.sweep()

    def sweep(self) -> list[str]:
        """End the live jobs of servers that are gone (see the module docstring).

        Returns:
            list[str]: the ids marked ``zombie``.
        """
        zombies = []
        for row in self.store.live():
            if row.owner is not None and pid_alive(row.owner):
                continue  # a live server's job (this one's, or another's on the same cache)
            if row.pgid and pid_alive(row.pgid):
                _kill_group(row.pgid)
            if row.status == "running":
                self.store.mark_zombie(row.id)
                zombies.append(row.id)
            else:
                error = "the server stopped before this job started"
                self.store.emit(row.id, {"type": "failed", "error": error})
        return zombies

    def submit(
        self, kind: str, config: dict[str, Any], output: str | None, env: dict[str, str]
    ) -> JobRow:
        """Store a ``queued`` job and start its task on the running event loop.

        Args:
            kind (str): ``finetune``, ``quantize`` or ``dataset``.
            config (dict): the submit body (completed with its resolved paths).
            output (str | None): where the job writes.
            env (dict[str, str]): extra environment of the runner (the server's
                own base URL for LLM-backed templates).

        Returns:
            JobRow: the stored row.
        """
        row = self.store.create(kind, config, output)
        task = asyncio.get_running_loop().create_task(self._run(row, env))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return row

    def cancel(self, job_id: str) -> JobRow | None:
        """End a queued or running job as ``failed`` (``cancelled``), killing its
        runner's process group; a job already ended is left as it is.

        Returns:
            JobRow | None: the row afterwards; ``None`` for an unknown id.
        """
        row = self.store.get(job_id)
        if row is None:
            return None
        if row.status not in TERMINAL:
            pgid = row.pgid
            self.store.emit(job_id, {"type": "failed", "error": "cancelled"})
            if pgid:
                _kill_group(pgid)
        return self.store.get(job_id)

    async def _run(self, row: JobRow, env: dict[str, str]) -> None:
        try:
            if row.kind in LEASE_KINDS and self.engine is not None:
                if self._accelerator is None:
                    self._accelerator = asyncio.Lock()
                async with self._accelerator:
                    if self._ended(row.id):
                        return
                    await self._leased(lambda: self._spawn_and_wait(row, env))
            else:
                await self._spawn_and_wait(row, env)
        except Exception as e:  # the job fails, the server goes on
            log.exception("job %s", row.id)
            if not self._ended(row.id):
                self.store.emit(row.id, {"type": "failed", "error": f"job runner: {e}"})

    def _ended(self, job_id: str) -> bool:
        found = self.store.get(job_id)
        return found is None or found.status in TERMINAL

    async def _leased(self, work: Callable[[], Any]) -> None:
        """Await ``work()`` while holding the engine thread (:class:`EngineLease`)."""
        lease = EngineLease(self.engine)
        await lease.acquire()
        try:
            await work()
        finally:
            await lease.release()

    async def _spawn_and_wait(self, row: JobRow, env: dict[str, str]) -> None:
        if self._ended(row.id):  # cancelled while it waited
            return
        argv = [sys.executable, "-m", "mlxspec.jobs.runner", str(self.store.root), row.id]
        argv.append(str(os.getpid()))
        child_env = {**os.environ, **env, "NO_COLOR": "1", "TERM": "dumb", "TQDM_DISABLE": "1"}
        child_env["PYTHONUNBUFFERED"] = "1"
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=child_env,
            start_new_session=True,  # its own process group: DELETE kills it all
        )
        self.store.set_pgid(row.id, proc.pid)
        self.store.emit(row.id, {"type": "started"})  # before any of its output
        if self._ended(row.id):  # cancelled between the check and the spawn
            _kill_group(proc.pid)
        assert proc.stdout is not None
        reader = threading.Thread(target=self._pump, args=(row.id, proc.stdout), daemon=True)
        reader.start()
        status = await asyncio.to_thread(proc.wait)
        await asyncio.to_thread(reader.join, 5)
        proc.stdout.close()
        result = result_path(self.store, row.id)
        try:
            end = json.loads(result.read_text())
            result.unlink()
        except (OSError, ValueError):
            why = f"signal {-status}" if status < 0 else f"status {status}"
            end = {"type": "failed", "error": f"the runner exited with {why} before the job ended"}
        self.store.emit(row.id, end)  # nothing when a cancel ended the job first

    def _pump(self, job_id: str, stream: IO[bytes]) -> None:
        """The runner's output, a ``log`` event a line (carriage returns split lines)."""
        for raw in stream:
            for part in raw.decode("utf-8", "replace").split("\r"):
                line = _ANSI.sub("", part).rstrip()
                if line:
                    self.store.emit(job_id, {"type": "log", "line": line[:MAX_LOG_LINE]})


def _kill_group(pgid: int) -> None:
    """SIGKILL the process group ``pgid`` (gone already is fine)."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass

"""The ``bash`` tool: one command in its own process group, time, output and
processes capped.

The command runs as ``bash -c`` in the workspace, in a new session
(``start_new_session``: its own process group), with no stdin and a small
environment (the server's secrets are not passed on). Its output streams to
the caller as it comes; past the output cap, or the time cap, or past
:data:`MAX_PROCESSES` processes in its group at once (a fork bomb, a runaway
loop of background jobs: counted every :data:`WATCH_S` seconds), or on
:meth:`Shell.kill` (the user's ``abort``), the whole group gets ``SIGKILL``
(``os.killpg``: the kernel signals the group at once, so a process forking
meanwhile cannot slip out), and a command's children and background jobs end
with it. A process that leaves the group on purpose (``setsid``, a daemon) is
neither counted nor killed: the tools confine paths, they are not a sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable

from mlxspec.handlers.webchat.tools.workspace import ToolError, Workspace

__all__ = ["Shell"]

#: Environment variables a command inherits; everything else is left out.
KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "USER", "SHELL", "TMPDIR")
#: Bytes read from the pipe at a time (each read is one ``tool_update``).
CHUNK = 4096
#: Processes a command's group may hold at once; past it the group is killed.
MAX_PROCESSES = 64
#: Seconds between two counts of the group.
WATCH_S = 0.1


def group_size(pgid: int) -> int:
    """How many processes are in process group ``pgid`` now.

    Reads ``/proc/<pid>/stat`` (its fifth field) on Linux, else asks ``ps``
    (macOS). Processes that exit while being read are not counted.
    """
    if os.path.isdir("/proc/self"):
        count = 0
        for name in os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            count += len(fields) > 2 and fields[2] == str(pgid).encode()
        return count
    import subprocess

    listing = subprocess.run(["ps", "-A", "-o", "pgid="], capture_output=True, check=False)
    return sum(line.strip() == str(pgid).encode() for line in listing.stdout.splitlines())


class Shell:
    """One ``bash`` call.

    Args:
        workspace (Workspace): the working folder.
        timeout (float): seconds before the group is killed.
        limit (int): output bytes kept; past it the group is killed.
        max_processes (int): processes the group may hold at once; past it the
            group is killed. Default: :data:`MAX_PROCESSES`.
    """

    def __init__(
        self, workspace: Workspace, timeout: float, limit: int, max_processes: int = MAX_PROCESSES
    ) -> None:
        self.workspace, self.timeout, self.limit = workspace, timeout, limit
        self.max_processes = max_processes
        self.pgid: int | None = None
        self._why: str | None = None

    def kill(self, why: str = "aborted") -> None:
        """SIGKILL the command's whole process group (idempotent)."""
        if self.pgid is None:
            return
        self._why = self._why or why
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signal.SIGKILL)

    async def run(self, command: object, emit: Callable[[str], Awaitable[None]]) -> str:
        """Run ``command``; ``emit`` each chunk of output as it comes.

        Returns:
            str: the output (cut at the cap) and how it ended.

        Raises:
            ToolError: ``command`` is not a non-empty string, the command failed
                (non-zero exit, killed), with its output in the message.
        """
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command must be a non-empty string")
        env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
        proc = await asyncio.create_subprocess_exec(
            "bash",
            "-c",
            command,
            cwd=self.workspace.root,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        self.pgid = proc.pid  # the session leader's pid is its group's id
        watch = asyncio.ensure_future(self._count(self.pgid))
        kept: list[bytes] = []
        size = 0
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(self.timeout):
                while chunk := await proc.stdout.read(CHUNK):
                    room = self.limit - size
                    if room <= 0:  # the rest is read (the pipe drains) but not kept
                        self.kill(f"output passed {self.limit} bytes")
                        continue
                    kept.append(chunk[:room])
                    size += min(len(chunk), room)
                    await emit(chunk[:room].decode("utf-8", "replace"))
                code = await proc.wait()
        except TimeoutError:
            self.kill(f"timed out after {self.timeout:g} s")
            code = await proc.wait()
        except BaseException:  # cancelled: the group must not outlive the call
            self.kill()
            with contextlib.suppress(BaseException):
                await asyncio.shield(proc.wait())
            raise
        finally:
            watch.cancel()
            self.kill("done")  # background jobs left in the group end with the call
            with contextlib.suppress(Exception):  # close the pipe: read what is left
                await asyncio.wait_for(proc.stdout.read(), 5)
        output = b"".join(kept).decode("utf-8", "replace")
        if self._why not in (None, "done"):
            raise ToolError(f"{output}\n[killed: {self._why}]".lstrip())
        if code != 0:
            raise ToolError(f"{output}\n[exit code {code}]".lstrip())
        return output or "(no output)"

    async def _count(self, pgid: int) -> None:
        """Kill the group once it holds more than ``max_processes`` processes."""
        while self._why is None:
            await asyncio.sleep(WATCH_S)
            if await asyncio.to_thread(group_size, pgid) > self.max_processes:
                self.kill(f"more than {self.max_processes} processes")
                return

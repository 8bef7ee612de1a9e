"""The ``bash`` tool: one command in its own process group, time and output capped.

The command runs as ``bash -c`` in the workspace, in a new session
(``start_new_session``: its own process group), with no stdin and a small
environment (the server's secrets are not passed on). Its output streams to
the caller as it comes; past the output cap, or the time cap, or on
:meth:`Shell.kill` (the user's ``abort``), the whole group gets ``SIGKILL``
(``os.killpg``), so a command's children and background jobs end with it.
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


class Shell:
    """One ``bash`` call.

    Args:
        workspace (Workspace): the working folder.
        timeout (float): seconds before the group is killed.
        limit (int): output bytes kept; past it the group is killed.
    """

    def __init__(self, workspace: Workspace, timeout: float, limit: int) -> None:
        self.workspace, self.timeout, self.limit = workspace, timeout, limit
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
            self.kill("done")  # background jobs left in the group end with the call
            with contextlib.suppress(Exception):  # close the pipe: read what is left
                await asyncio.wait_for(proc.stdout.read(), 5)
        output = b"".join(kept).decode("utf-8", "replace")
        if self._why not in (None, "done"):
            raise ToolError(f"{output}\n[killed: {self._why}]".lstrip())
        if code != 0:
            raise ToolError(f"{output}\n[exit code {code}]".lstrip())
        return output or "(no output)"

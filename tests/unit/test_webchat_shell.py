"""The web agent's ``bash`` tool under runaway commands (issue 31): a fork bomb
and a loop of background jobs are killed whole once their group passes
``MAX_PROCESSES``, long before the time cap, and leave no process behind; a
command under the cap runs as before. The bomb is bounded (depth 8, at most
about a thousand processes) so that a broken cap cannot take the machine down."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from mlxspec.handlers.webchat.tools.shell import MAX_PROCESSES, Shell, group_size
from mlxspec.handlers.webchat.tools.workspace import ToolError, Workspace

pytestmark = pytest.mark.subprocess

#: A binary-tree fork bomb of depth 8: every node forks two and sleeps.
BOMB = "f() { if [ $1 -lt 8 ]; then f $(($1+1)) & f $(($1+1)) & fi; sleep 30; }; f 0"


def _run(shell: Shell, command: str) -> tuple[str, float]:
    """Run ``command``; its result (or ToolError message) and the seconds it took."""
    chunks: list[str] = []

    async def emit(chunk: str) -> None:
        chunks.append(chunk)

    t0 = time.monotonic()
    try:
        result = asyncio.run(shell.run(command, emit))
    except ToolError as exc:
        result = str(exc)
    return result, time.monotonic() - t0


def _until_empty(pgid: int, timeout: float = 10) -> int:
    deadline = time.monotonic() + timeout
    while (left := group_size(pgid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize(
    "command",
    [BOMB, "for i in $(seq 300); do sleep 30 & done; wait"],
    ids=["fork-bomb", "background-jobs"],
)
def test_a_runaway_command_is_killed_whole_at_the_process_cap(tmp_path: Path, command: str) -> None:
    shell = Shell(Workspace(tmp_path), timeout=60, limit=65536)
    result, seconds = _run(shell, command)
    assert result.endswith(f"[killed: more than {MAX_PROCESSES} processes]")
    assert seconds < 30  # the cap, not the 60 s timeout (nor the bomb's own sleep)
    assert shell.pgid is not None and _until_empty(shell.pgid) == 0


def test_a_command_under_the_cap_runs_to_its_end(tmp_path: Path) -> None:
    shell = Shell(Workspace(tmp_path), timeout=60, limit=65536, max_processes=8)
    result, _ = _run(shell, "for i in 1 2 3; do sleep 0.3 & done; wait; echo done")
    assert result == "done\n"


def test_the_cap_is_the_shells_own(tmp_path: Path) -> None:
    shell = Shell(Workspace(tmp_path), timeout=60, limit=65536, max_processes=4)
    result, _ = _run(shell, "for i in 1 2 3 4 5 6; do sleep 5 & done; wait; echo never")
    assert "never" not in result and result.endswith("[killed: more than 4 processes]")


def test_group_size_counts_a_group() -> None:
    assert group_size(os.getpgrp()) >= 1
    assert group_size(2**22 + 12345) == 0  # above Linux's pid_max default: no such group

"""Helpers for talking to live servers on loopback: a free port and a health wait.

Shared by the fuzz and parity harnesses, the tests' server fixtures and the
benchmark, which all start ``mlxspec serve`` (or ``mlx_lm.server``) in a
subprocess and wait for ``GET /health``.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx


def free_port() -> int:
    """An unused TCP port on 127.0.0.1 (the OS picks it; free when this returns)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(base: str, timeout: float, proc: subprocess.Popen | None = None) -> None:
    """Poll ``GET {base}/health`` until it answers 200.

    Args:
        base (str): server base URL, e.g. ``http://127.0.0.1:8080``.
        timeout (float): seconds to wait.
        proc (subprocess.Popen | None): the server process; its exit ends the
            wait early. Default: ``None``.

    Raises:
        RuntimeError: ``proc`` exited.
        TimeoutError: no 200 within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"{base} not healthy after {timeout:.0f}s")


@contextmanager
def serve(argv: list[str], env: dict[str, str], log: Path, timeout: float = 600) -> Iterator[str]:
    """Run a server command until it answers ``GET /health``; yield its base URL
    and terminate it when the block ends.

    Args:
        argv (list[str]): the command; ``{port}`` in any item is replaced by a free port
            (only that: other braces, a chat template's say, stay as they are).
        env (dict[str, str]): its environment.
        log (Path): file for its stdout and stderr.
        timeout (float): seconds to wait for health. Default: ``600``.

    Yields:
        str: ``http://127.0.0.1:<port>``.

    Raises:
        RuntimeError: it exited or never became healthy (with its log tail).
    """
    port = free_port()
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [a.replace("{port}", str(port)) for a in argv],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(base, timeout, proc)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(f"{argv[2]}: {exc}\n{log.read_text()[-3000:]}") from None
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

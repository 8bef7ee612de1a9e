"""Helpers for talking to live servers on loopback: a free port and a health wait.

Shared by the fuzz and parity harnesses, the tests' server fixtures and the
benchmark, which all start ``mlxspec serve`` (or ``mlx_lm.server``) in a
subprocess and wait for ``GET /health``.
"""

from __future__ import annotations

import socket
import subprocess
import time

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

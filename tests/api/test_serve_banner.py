"""``mlxspec serve`` prints its URLs once it listens: a user who opens the
address as soon as the line shows is answered, not refused (building the app
and uvicorn's start-up took 24 s after the line on a busy 2-core CPU)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx

from tests.conftest import SERVER_BLAS


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_url_is_printed_once_the_server_listens(tiny_model_dir: Path) -> None:
    port = _free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_BLAS": SERVER_BLAS}
    argv = [sys.executable, "-m", "mlxspec", "serve", str(tiny_model_dir), "--port", str(port)]
    proc = subprocess.Popen(
        argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # ends when the process does
            lines.append(line.rstrip("\n"))
            if line.startswith("mlxspec: serving "):
                # at once, no retry: the socket must already listen
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=30)
                assert (health.status_code, health.json()) == (200, {"status": "ok"})
                break
        else:
            raise AssertionError(f"no serving line; exit {proc.wait()}: {lines}")
        assert line.rstrip("\n").endswith(f"at http://127.0.0.1:{port}/v1")
        assert proc.stdout.readline().rstrip("\n") == (
            f"mlxspec: web chat at http://127.0.0.1:{port}/"
        )
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()

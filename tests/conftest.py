"""What every tier shares: the environment tests run in and :class:`LiveServer`.

Tiers: ``unit/`` needs nothing; ``api/`` uses a 2-layer random Llama (its
``conftest.py``: ``tiny_engine``, ``tiny_server``, ``client``, ...); ``real/``
runs ``mlxspec serve`` on the embedded SmolLM2-135M model in a subprocess, as a
user would (``real_server``).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# In-process engines keep MLX's reference BLAS: tests compare batched rows with lone
# runs bit for bit, and MKL's kernels round differently for different row counts.
# ``real_server`` (a subprocess, as users run it) gets the optimised BLAS back.
SERVER_BLAS = os.environ.get("MLXSPEC_BLAS", "auto")
os.environ["MLXSPEC_BLAS"] = "off"

from mlxspec.conformance.httpx_checks import checking_client  # noqa: E402
from mlxspec.conformance.live import free_port, serve, wait_healthy  # noqa: E402, F401


class LiveServer:
    """uvicorn serving an ASGI app on a real socket, in a background thread
    (httpx's ASGI transport buffers whole responses, so SSE timing and
    disconnect tests need this), with the connection handling and limits of
    ``mlxspec serve`` (``config``'s, default :class:`ServeConfig`'s)."""

    def __init__(self, app: object, config: object = None) -> None:
        import dataclasses

        import uvicorn

        from mlxspec.config import ServeConfig
        from mlxspec.http.connections import uvicorn_config

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        config = dataclasses.replace(
            config or ServeConfig(), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(uvicorn_config(app, config))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        wait_healthy(self.base, 15)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlxspec serve`` on the embedded default model, in a subprocess.

    Yields the base URL (``http://127.0.0.1:<port>``). The GGUF conversion is
    cached under ``MLXSPEC_CACHE_DIR`` (default ~/.cache/mlxspec).
    """
    log = tmp_path_factory.mktemp("real") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_BLAS": SERVER_BLAS}
    argv = [sys.executable, "-m", "mlxspec", "serve", "--port", "{port}"]
    with serve(argv, env, log, timeout=300) as base:
        yield base


@pytest.fixture()
def real_client(real_server: str) -> Iterator[httpx.Client]:
    """An httpx client bound to ``real_server`` that checks every response
    against the OpenAPI document, like ``client``."""
    with checking_client(real_server, timeout=120) as c:
        yield c

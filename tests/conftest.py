"""What every tier shares: the environment tests run in and :class:`LiveServer`.

Tiers: ``unit/`` needs nothing; ``api/`` uses a 2-layer random Llama (its
``conftest.py``: ``tiny_engine``, ``tiny_server``, ``client``, ...); ``real/``
runs ``mlxspec serve`` on the embedded SmolLM2-135M model in a subprocess, as a
user would (``real_server``). Every test is also sorted into a tier at
collection (``fast`` or the reasons it is not: ``tests/tiers.py``, docs/testing.md).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# In-process engines keep MLX's reference BLAS: tests compare batched rows with lone
# runs bit for bit, and MKL's kernels round differently for different row counts.
# ``real_server`` (tests/real/, a subprocess as users run it) gets the optimised BLAS back.
SERVER_BLAS = os.environ.get("MLXSPEC_BLAS", "auto")
os.environ["MLXSPEC_BLAS"] = "off"

import pytest  # noqa: E402

from mlxspec.conformance.live import free_port, wait_healthy  # noqa: E402
from tests import order, tiers  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    """The tier markers, the guard that keeps process-starting tests out of
    ``fast``, and xdist's queue in collection order (tests/order.py)."""
    tiers.configure(config)
    order.keep_collection_order(config)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Sort every collected test into its tier (before -m selects by marker),
    then the files costliest first (the order xdist's workers get them)."""
    tiers.classify(items)
    order.costliest_first(items)


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

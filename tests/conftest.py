"""Shared fixtures: tiny random models, in-process apps and live servers.

Tiers: pure unit tests need nothing; ``tiny_engine``/``tiny_server`` use a
2-layer random Llama (fast); ``real_server`` runs ``mlxspec serve`` on the
embedded SmolLM2-135M model in a subprocess, as a user would.
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

from fixtures.tiny_model import build_tiny_llama  # noqa: E402
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
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama folder with a ChatML template (context 256)."""
    return build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_dir: Path) -> Iterator[object]:
    """A started engine on the tiny model."""
    from mlxspec.engine import Engine

    engine = Engine.load(tiny_model_dir, "tiny-llama")
    engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def tiny_app(tiny_engine: object) -> object:
    """The ASGI app on the tiny engine, validating responses against the document."""
    from mlxspec.http.app import create_app

    return create_app(tiny_engine, validate_responses=True)


@pytest.fixture(scope="session")
def tiny_server(tiny_app: object) -> Iterator[LiveServer]:
    """A live uvicorn server on the tiny model."""
    with LiveServer(tiny_app) as server:
        yield server


@pytest.fixture()
def client(tiny_server: LiveServer) -> Iterator[httpx.Client]:
    """An httpx client bound to the tiny live server that checks every response
    against the OpenAPI document (status, headers, body, each SSE frame)."""
    with checking_client(tiny_server.base, timeout=60) as c:
        yield c


@pytest.fixture()
def sdk(tiny_server: LiveServer) -> Iterator[object]:
    """The official ``openai`` SDK on the tiny live server, checking every
    response like ``client`` (modules may override it for another server)."""
    from tests.helpers import openai_sdk  # it imports LiveServer from here

    with openai_sdk(tiny_server.base) as c:
        yield c


@pytest.fixture(scope="session")
def openai_server(tiny_engine: object) -> Iterator[LiveServer]:
    """A live server on the tiny engine with ``--logprobs-format openai``."""
    from mlxspec.config import ServeConfig
    from mlxspec.http.app import create_app

    config = ServeConfig(logprobs_format="openai")
    with LiveServer(create_app(tiny_engine, config, validate_responses=True)) as server:
        yield server


@pytest.fixture()
def oclient(openai_server: LiveServer) -> Iterator[httpx.Client]:
    """A checking httpx client (like ``client``) on ``openai_server``."""
    with checking_client(openai_server.base, timeout=60) as c:
        yield c


@pytest.fixture(scope="session")
def templates_server(tiny_engine: object) -> Iterator[LiveServer]:
    """A live server on the tiny engine with ``--allow-request-templates``
    (and the default bounds)."""
    from mlxspec.config import ServeConfig
    from mlxspec.http.app import create_app

    config = ServeConfig(allow_request_templates=True)
    with LiveServer(create_app(tiny_engine, config, validate_responses=True)) as server:
        yield server


@pytest.fixture()
def tclient(templates_server: LiveServer) -> Iterator[httpx.Client]:
    """A checking httpx client (like ``client``) on ``templates_server``."""
    with checking_client(templates_server.base, timeout=60) as c:
        yield c


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

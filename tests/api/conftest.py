"""Fixtures of the api tier: the tiny random Llama, its engine, in-process apps
and live servers on it, and the contract-checking clients bound to them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fixtures.tiny_model import build_tiny_llama
from mlxspec.conformance.httpx_checks import checking_client
from tests.conftest import LiveServer
from tests.helpers import openai_sdk


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

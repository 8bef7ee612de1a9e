"""Fixtures of the real tier: ``mlxspec serve`` on the embedded SmolLM2-135M
model in a subprocess, and a contract-checking client bound to it. Every test
in this folder is marked ``real_model`` (by tests/tiers.py, at collection)."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import httpx
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.conformance.live import serve
from tests.conftest import SERVER_BLAS


@pytest.fixture(scope="session")
def real_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlxspec serve`` on the embedded default model, in a subprocess.

    Yields the base URL (``http://127.0.0.1:<port>``). The GGUF conversion is
    cached under ``MLXSPEC_CACHE_DIR`` (default ~/.cache/mlxspec).
    """
    log = tmp_path_factory.mktemp("real") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_BLAS": SERVER_BLAS}
    # --whisper-model none: the chat model alone (its /v1/models is one row)
    argv = [sys.executable, "-m", "mlxspec", "serve", "--port", "{port}", "--whisper-model", "none"]
    with serve(argv, env, log, timeout=300) as base:
        yield base


@pytest.fixture()
def real_client(real_server: str) -> Iterator[httpx.Client]:
    """An httpx client bound to ``real_server`` that checks every response
    against the OpenAPI document, like ``client``."""
    with checking_client(real_server, timeout=120) as c:
        yield c

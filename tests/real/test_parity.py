"""Parity with mlx_lm.server, recorded mode: mlxspec on the embedded model
against mlx_lm.server's responses stored in ``fixtures/parity/reference/``
(the comparator and the case files: ``tests/unit/test_parity.py``).

The live run (both servers) is ``python -m mlxspec.conformance parity --live``;
its table is ``docs/parity-report.md``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import httpx
import pytest

from mlxspec.conformance import parity
from mlxspec.conformance.live import serve
from mlxspec.conformance.parity import Case, load_cases

CASES = load_cases()


@pytest.fixture(scope="module")
def parity_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlxspec serve`` on the embedded model with the checkpoint's own weights
    (``parity.NATIVE_WEIGHTS``), the numbers mlx_lm.server computes with."""
    log = tmp_path_factory.mktemp("parity") / "serve.log"
    argv = [sys.executable, "-m", "mlxspec", "serve", "--port", "{port}", *parity.NATIVE_WEIGHTS]
    with serve(argv, {**os.environ, "HF_HUB_OFFLINE": "1"}, log, timeout=300) as base:
        yield base


@pytest.fixture(scope="module")
def http(parity_server: str) -> Iterator[httpx.Client]:
    with httpx.Client(timeout=300) as client:
        yield client


@pytest.mark.real_model
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_mlx_lm_server(case: Case, parity_server: str, http: httpx.Client) -> None:
    outcome = parity.check_recorded(http, parity_server, case)
    assert outcome.ok, f"{outcome.verdict}: {outcome.fields} {outcome.detail}"

"""Helpers shared by the test modules: SDK clients that check every response
against the document, scripted tool-model servers, and an error assertion
several surfaces' tests repeat.

Fixtures stay in the tiers' ``conftest.py`` files (:class:`LiveServer` in
``tests/conftest.py``); this module holds plain functions, imported as
``tests.helpers``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import httpx2
import openai

from fixtures.tool_models import build_tool_model
from mlxspec.conformance.httpx_checks import checking_client
from tests.conftest import LiveServer
from tests.fakes import FakeEngine

#: Bounded JSON so the tiny random model must finish it.
TINY_SCHEMA = {
    "type": "object",
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "n": {"type": "integer", "minimum": 0, "maximum": 9},
    },
    "required": ["kind", "n"],
}


def openai_sdk(base: str, timeout: float = 60) -> openai.OpenAI:
    """The official ``openai`` SDK on a live server, without retries, over a
    client that checks every response against the document.

    Args:
        base (str): the server root, e.g. ``http://127.0.0.1:8000``.
        timeout (float): seconds per request. Default: ``60``.

    Returns:
        openai.OpenAI: use it as a context manager to close it.
    """
    return openai.OpenAI(
        base_url=f"{base}/v1",
        api_key="not-needed",
        max_retries=0,
        http_client=checking_client(timeout=timeout),
    )


def anthropic_sdk(base: str, timeout: float = 60) -> anthropic.Anthropic:
    """The official ``anthropic`` SDK on a live server, without retries, over an
    ``httpx2`` client (the fork the SDK requires) that checks every response
    against the document.

    Args:
        base (str): the server root, e.g. ``http://127.0.0.1:8000``.
        timeout (float): seconds per request. Default: ``60``.

    Returns:
        anthropic.Anthropic: use it as a context manager to close it.
    """
    return anthropic.Anthropic(
        base_url=base,
        api_key="k",
        max_retries=0,
        http_client=checking_client(timeout=timeout, http=httpx2),
    )


@contextmanager
def scripted_tool_server(folder: Path, style: str) -> Iterator[tuple[FakeEngine, LiveServer]]:
    """A :class:`~tests.fakes.FakeEngine` on a tool fixture model,
    behind a live server that validates its responses.

    Args:
        folder (Path): where to build the model (a new folder).
        style (str): the tool model's template, e.g. ``"hermes"`` or ``"think"``.

    Yields:
        tuple[FakeEngine, LiveServer]: set ``engine.script`` before each request.
    """
    from mlxspec.http.app import create_app  # the app stack is heavy: only tests that serve pay

    engine = FakeEngine.from_dir(build_tool_model(folder, style))
    with LiveServer(create_app(engine, validate_responses=True)) as server:
        yield engine, server


async def text_and_finish(engine: Any, request: Any) -> tuple[str, Any]:
    """Submit ``request`` to a started engine and gather its output.

    Returns:
        tuple[str, Finished]: the joined text and the ``Finished`` event.
    """
    from mlxspec.engine import Delta, Finished

    text, finished = "", None
    async for event in engine.submit(request):
        if isinstance(event, Delta):
            text += event.text
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return text, finished


def assert_invalid_request(r: httpx.Response, param: str, message: str) -> None:
    """Assert an OpenAI-style 400 ``invalid_request_error`` with this param and message."""
    assert r.status_code == 400, r.text
    assert r.json()["error"] == {
        "message": message,
        "type": "invalid_request_error",
        "param": param,
        "code": None,
    }

"""Chat and text completion streams carry ``usage`` only where OpenAI's
contract puts it (issue 25, item 10): in the extra final chunk that
``stream_options.include_usage`` asks for, else nowhere; ``--stream-usage
always`` keeps the reference's usage on the finishing chunk."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from tests.conftest import LiveServer

CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
TEXT = ("/v1/completions", {"prompt": "hi"})


def _chunks(client: httpx.Client, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    body = {**body, "stream": True, "max_tokens": 3, "temperature": 0}
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    lines = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.fixture(scope="module")
def always_server(tiny_engine: object) -> Iterator[LiveServer]:
    from mlxspec.config import ServeConfig
    from mlxspec.http.app import create_app

    config = ServeConfig(stream_usage="always")
    with LiveServer(create_app(tiny_engine, config, validate_responses=True)) as server:
        yield server


@pytest.mark.parametrize(("path", "body"), [CHAT, TEXT], ids=["chat", "text"])
def test_no_usage_unless_asked(client: httpx.Client, path: str, body: dict) -> None:
    chunks = _chunks(client, path, body)
    assert [c for c in chunks if "usage" in c] == []
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("path", "body"), [CHAT, TEXT], ids=["chat", "text"])
def test_include_usage_gets_one_chunk_of_its_own(
    client: httpx.Client, path: str, body: dict
) -> None:
    chunks = _chunks(client, path, {**body, "stream_options": {"include_usage": True}})
    assert [i for i, c in enumerate(chunks) if "usage" in c] == [len(chunks) - 1]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("path", "body"), [CHAT, TEXT], ids=["chat", "text"])
def test_stream_usage_always_keeps_the_reference_behaviour(
    always_server: LiveServer, path: str, body: dict
) -> None:
    with checking_client(always_server.base, timeout=60) as client:
        chunks = _chunks(client, path, body)
        assert [i for i, c in enumerate(chunks) if "usage" in c] == [len(chunks) - 1]
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        assert chunks[-1]["usage"]["completion_tokens"] == 3
        # asked for, it still comes in a chunk of its own, on no other
        asked = _chunks(client, path, {**body, "stream_options": {"include_usage": True}})
        assert [i for i, c in enumerate(asked) if "usage" in c] == [len(asked) - 1]
        assert asked[-1]["choices"] == []

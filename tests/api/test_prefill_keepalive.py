"""A long prefill must not look dead: Messages and Responses streams send their
opening events at once, then SSE keep-alive comments until the first token.

A scripted engine (``fixtures.tool_models``) stands in for the model: its
first token comes after ``delay`` seconds, as after a long agent prompt's
prefill. Timing needs a real socket (httpx's ASGI transport buffers)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from mlxspec.http import sse
from tests.helpers import scripted_tool_server

#: Seconds before the scripted first token, and the keep-alive interval under test.
PREFILL_S, INTERVAL_S = 0.8, 0.1


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with scripted_tool_server(tmp_path_factory.mktemp("slow") / "m", "hermes") as (engine, srv):
        engine.script, engine.delay = ["Hi", "!"], PREFILL_S
        yield srv.base


def timed_lines(base: str, path: str, body: dict) -> list[tuple[float, str]]:
    """Each non-empty SSE line with the seconds since the request went out."""
    start = time.monotonic()
    out = []
    with httpx.stream("POST", base + path, json=body, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                out.append((time.monotonic() - start, line))
    return out


@pytest.mark.parametrize(
    ("path", "body", "opening", "first_token"),
    [
        (
            "/v1/messages",
            {
                "model": "m",
                "max_tokens": 8,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
            "event: message_start",
            "event: content_block_start",
        ),
        (
            "/v1/responses",
            {"input": "hi", "stream": True},
            "event: response.created",
            "event: response.output_item.added",
        ),
    ],
)
def test_opening_events_at_once_then_keepalives_until_the_first_token(
    base: str,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    body: dict,
    opening: str,
    first_token: str,
) -> None:
    monkeypatch.setattr(sse, "KEEPALIVE_INTERVAL_S", INTERVAL_S)
    lines = timed_lines(base, path, body)
    names = [line for _, line in lines]
    assert names[0] == opening
    token_at = names.index(first_token)
    # the opening events went out before the prefill, not with the first token
    assert lines[token_at][0] - lines[0][0] > PREFILL_S * 0.6
    silence = [line for line in names[:token_at] if line.startswith(":")]
    assert silence and set(silence) == {": keep-alive"}
    assert len(silence) >= int(PREFILL_S / INTERVAL_S) // 2

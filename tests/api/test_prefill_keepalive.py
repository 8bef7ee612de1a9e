"""A long prefill must not look dead: Messages and Responses streams send their
opening events at once, then SSE keep-alive comments until the first token.

A scripted engine (``fixtures.tool_models``) stands in for the model: its
first token waits for a gate the test opens only after it has read the opening
events and some keep-alives, as after a long agent prompt's prefill, so nothing
here hangs on how busy the machine is. A real socket is needed (httpx's ASGI
transport buffers)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest

from mlxspec.http import sse
from tests.helpers import scripted_tool_server

#: The keep-alive interval under test (seconds), and how many keep-alives the
#: client reads before it lets the first token out.
INTERVAL_S, KEEPALIVES_BEFORE_TOKEN = 0.1, 3


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, str]]:
    with scripted_tool_server(tmp_path_factory.mktemp("slow") / "m", "hermes") as (engine, srv):
        engine.script, engine.delay = ["Hi", "!"], 0.01
        yield engine, srv.base


def gated_lines(engine: object, base: str, path: str, body: dict) -> tuple[list[str], int]:
    """Each non-empty SSE line, and how many came before the gate opened: the
    gate opens once :data:`KEEPALIVES_BEFORE_TOKEN` keep-alives were read."""
    gate = threading.Event()
    engine.first_token_gate = gate  # type: ignore[attr-defined]
    out: list[str] = []
    before = -1
    try:
        with httpx.stream("POST", base + path, json=body, timeout=20) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if not line:
                    continue
                out.append(line)
                if not gate.is_set() and out.count(": keep-alive") >= KEEPALIVES_BEFORE_TOKEN:
                    before = len(out)
                    gate.set()
    finally:
        gate.set()
        engine.first_token_gate = None  # type: ignore[attr-defined]
    return out, before


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
    served: tuple[object, str],
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    body: dict,
    opening: str,
    first_token: str,
) -> None:
    monkeypatch.setattr(sse, "KEEPALIVE_INTERVAL_S", INTERVAL_S)
    names, before = gated_lines(*served, path, body)
    assert names[0] == opening
    # the opening events and the keep-alives all went out while no token existed
    assert before == names.index(": keep-alive") + KEEPALIVES_BEFORE_TOKEN
    assert names.index(first_token) >= before
    assert names[-1].startswith("data:")  # the stream ran to its end
    silence = [line for line in names[: names.index(first_token)] if line.startswith(":")]
    assert set(silence) == {": keep-alive"} and len(silence) >= KEEPALIVES_BEFORE_TOKEN

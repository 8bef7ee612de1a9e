"""The supervisor's proxy (issue 29 item 2), in-process: an upstream ASGI app on
a unix socket, :func:`forward_http` in front of it on TCP. The bytes a client
reads are the upstream's bytes, chunk by chunk as they are written (SSE
unbuffered), and a client that leaves closes the upstream request."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxspec.config import ServeConfig
from mlxspec.supervisor.proxy import forward_http
from tests.conftest import LiveServer

FRAMES = [
    b'data: {"a":1}\n\n',
    b'data: {"b":"\\u00e9 \xc3\xa9"}\n\n',
    b": keep-alive\n\n",
    b"data: [DONE]\n\n",
]
GAP_S = 0.4


class Upstream:
    """An SSE app: :data:`FRAMES`, :data:`GAP_S` apart; records a client's departure."""

    def __init__(self) -> None:
        self.left = threading.Event()
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        self.bodies.append(body)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"x-upstream", b"1")],
            }
        )

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.left.set()

        watcher = asyncio.ensure_future(watch())
        for frame in FRAMES:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
            await asyncio.sleep(GAP_S if scope["path"] == "/stream" else 30)
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        watcher.cancel()


@pytest.fixture()
def proxied(tmp_path: Path) -> Iterator[tuple[str, Upstream]]:
    import uvicorn

    from mlxspec.http.connections import bind_unix

    upstream = Upstream()
    path = str(tmp_path / "up.sock")
    sock = bind_unix(path)
    server = uvicorn.Server(uvicorn.Config(upstream, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()

    async def proxy(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        transport = httpx.AsyncHTTPTransport(uds=path)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            await forward_http(scope, receive, send, client)

    with LiveServer(_Healthy(proxy), ServeConfig()) as live:
        yield live.base, upstream
    server.should_exit = True
    thread.join(10)


class _Healthy:
    """``GET /health`` answered here (LiveServer waits on it); the rest proxied."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] == "/health":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        await self.app(scope, receive, send)


def test_sse_passes_byte_for_byte_and_unbuffered(proxied: tuple[str, Upstream]) -> None:
    base, upstream = proxied
    chunks, times = [], []
    started = time.monotonic()
    with httpx.stream(
        "POST",
        f"{base}/stream",
        content=b'{"x": 1}',
        timeout=30,
        headers={"content-type": "application/json"},
    ) as answer:
        assert answer.headers["content-type"] == "text/event-stream"
        assert answer.headers["x-upstream"] == "1"
        for chunk in answer.iter_raw():
            chunks.append(chunk)
            times.append(time.monotonic() - started)
    assert b"".join(chunks) == b"".join(FRAMES)
    assert upstream.bodies == [b'{"x": 1}']  # the request body went up whole
    # the first frame arrived before the upstream had written the last (3 gaps later)
    assert times[0] < times[-1] - 2 * GAP_S


def test_a_client_that_leaves_closes_the_upstream_request(proxied: tuple[str, Upstream]) -> None:
    base, upstream = proxied
    with httpx.stream(
        "POST",
        f"{base}/slow",
        content=b"{}",
        timeout=30,
        headers={"content-type": "application/json"},
    ) as answer:
        first = next(answer.iter_raw())
        assert first == FRAMES[0]
    assert upstream.left.wait(10)  # the upstream saw its client go: the engine request is cancelled

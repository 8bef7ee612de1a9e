"""The ASGI scope and ``receive`` of one ``POST /v1/chat/completions`` with a JSON
body, for code that drives the app in process without an HTTP client: the
benchmarks (``benchmarks/http_overhead.py``, ``stream_overhead.py``) and tests
that need a raw channel (a body that never arrives, a declared length)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


def chat_post_scope(body_bytes: int) -> dict[str, Any]:
    """An HTTP/1.1 ASGI 3.0 scope for a chat request whose body is ``body_bytes`` long.

    Args:
        body_bytes (int): the JSON body's length (its ``Content-Length``).

    Returns:
        dict: the scope, from 127.0.0.1 to host ``localhost``.
    """
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "root_path": "",
        "query_string": b"",
        "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(body_bytes).encode()),
            (b"host", b"localhost"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }


def one_body_receive(body: bytes) -> tuple[Callable[[], Awaitable[dict]], asyncio.Event]:
    """An ASGI ``receive`` that hands over ``body`` in one message, then waits for
    the returned event before reporting the client's disconnect (set it once the
    app has answered, so a streaming response is not cut short).

    Args:
        body (bytes): the whole request body.

    Returns:
        tuple: ``(receive, done)``.
    """
    sent, done = False, asyncio.Event()

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    return receive, done

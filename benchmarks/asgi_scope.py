"""The ASGI scope of one ``POST /v1/chat/completions`` with a JSON body, for the
benchmarks that drive the app in process (``http_overhead.py``, ``stream_overhead.py``)."""

from __future__ import annotations

from typing import Any


def chat_post_scope(body_bytes: int) -> dict[str, Any]:
    """An HTTP/1.1 ASGI 3.0 scope for a chat request whose body is ``body_bytes`` long.

    Args:
        body_bytes (int): the JSON body's length (its ``Content-Length``).

    Returns:
        dict: the scope, from 127.0.0.1 to host ``bench``.
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
            (b"host", b"bench"),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }

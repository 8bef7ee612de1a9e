"""The proxy: one request's bytes to a child over its unix socket and back.

HTTP goes through httpx (``AsyncHTTPTransport(uds=...)``): the request body is
streamed up (or replayed, when the router has read it), the response streamed
down chunk by chunk as the child writes it (``aiter_raw``: SSE frames pass
unbuffered and byte for byte). WebSockets (``/ws/chat``) go through the
``websockets`` client's ``unix_connect``. The proxy knows no API surface: the
child answers everything, including the refusals (Host, Origin, API key,
validation); the proxy's own answers are ``502 engine_unavailable`` (the child
cannot be reached) in the path's surface's envelope, and, when a stream breaks
after its headers, one in-band error frame in that surface's framing.

A client that leaves cancels the exchange: the upstream response is closed,
so the child sees its client leave and cancels the generation (within a step).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from mlxspec.errors import ApiError, anthropic_error_body, send_error, surface_for_path
from mlxspec.http.sse import error_frame, named_frame

log = logging.getLogger("mlxspec.supervisor")

#: Hop-by-hop headers (RFC 9110 section 7.6.1) and those the parent's own
#: server writes (``date``, ``server``): never copied from one side to the other.
_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"date",
        b"server",
    }
)


def unavailable(message: str) -> ApiError:
    """The ``502 engine_unavailable`` error (reference, "Internal routes")."""
    return ApiError("engine_unavailable", message)


class ClientLeft(Exception):
    """The client disconnected while its request body was being sent up."""


async def forward_http(
    scope: Scope,
    receive: Receive,
    send: Send,
    client: httpx.AsyncClient,
    body: bytes | None = None,
) -> int:
    """Proxy one HTTP request to the child ``client`` is bound to.

    Args:
        scope (Scope): the request.
        receive (Receive): its ASGI channel (the body when ``body`` is ``None``,
            then the client's disconnect).
        send (Send): the response channel.
        client (httpx.AsyncClient): bound to the child's socket.
        body (bytes | None): the body, when already read. Default: ``None`` (streamed).

    Returns:
        int: the status answered, ``499`` when the client left first, ``502``
        when the child could not be reached.
    """
    body_done = asyncio.Event()
    if body is not None:
        body_done.set()
        content: Any = body
    else:
        content = _stream_body(receive, body_done)
    request = client.build_request(
        scope["method"],
        httpx.URL(
            path=scope.get("raw_path", b"").decode("latin-1") or scope["path"],
            query=scope.get("query_string", b""),
        ),
        headers=[(k, v) for k, v in scope.get("headers", []) if k not in _HOP],
        content=content,
    )
    status: list[int] = []
    exchange = asyncio.ensure_future(_exchange(scope, send, client, request, status))
    watcher = asyncio.ensure_future(_until_disconnect(receive, body_done))
    done, _ = await asyncio.wait({exchange, watcher}, return_when=asyncio.FIRST_COMPLETED)
    if exchange in done:
        watcher.cancel()
        try:
            exchange.result()
        except ClientLeft:  # it left while its body was being sent up
            return 499
        return status[-1] if status else 502
    exchange.cancel()  # the client left: closing upstream cancels the child's request
    with contextlib.suppress(asyncio.CancelledError, ClientLeft):
        await exchange
    log.info(
        "%s %s 499 - the client left mid-proxy; the engine request was cancelled",
        scope["method"],
        scope["path"],
    )
    return 499


async def _stream_body(receive: Receive, done: asyncio.Event) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientLeft
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            done.set()
            return


async def _until_disconnect(receive: Receive, body_done: asyncio.Event) -> None:
    await body_done.wait()
    while (await receive())["type"] != "http.disconnect":
        pass


async def _exchange(
    scope: Scope, send: Send, client: httpx.AsyncClient, request: httpx.Request, status: list[int]
) -> None:
    try:
        upstream = await client.send(request, stream=True)
    except httpx.TransportError:
        status.append(502)
        await send_error(scope, send, unavailable("the engine process is unavailable"))
        return
    started = False
    try:
        headers = [(k, v) for k, v in upstream.headers.raw if k.lower() not in _HOP]
        status.append(upstream.status_code)
        await send(
            {"type": "http.response.start", "status": upstream.status_code, "headers": headers}
        )
        started = True
        async for chunk in upstream.aiter_raw():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except httpx.TransportError:
        if not started:
            raise
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            frame = stream_error_frame(scope["path"], "the engine process exited mid-stream")
            await send({"type": "http.response.body", "body": frame, "more_body": False})
        else:
            raise  # a body cut short: the server closes the connection
    finally:
        await upstream.aclose()


def stream_error_frame(path: str, message: str) -> bytes:
    """The in-band error event of ``path``'s stream framing (after its headers).

    Args:
        path (str): the request path (its surface picks the framing).
        message (str): what went wrong.

    Returns:
        bytes: an Anthropic ``event: error`` frame on ``/v1/messages``, a
        Responses ``event: error`` on ``/v1/responses``, else OpenAI's ``data:``
        error frame.
    """
    err = unavailable(message)
    if surface_for_path(path) == "anthropic":
        return named_frame("error", anthropic_error_body(err))
    if path == "/v1/responses":
        return named_frame(
            "error",
            {"type": "error", "code": "engine_unavailable", "message": message, "param": None},
        )
    return error_frame(err)


async def forward_websocket(scope: Scope, receive: Receive, send: Send, socket_path: str) -> None:
    """Proxy a WebSocket (``/ws/chat``) to the child on ``socket_path``.

    The child's handshake decides (Host, Origin, API key): a refusal is relayed
    as its status and body where the server supports denial responses, else as
    a close before accepting. Once both sides are open, frames are copied both
    ways until either closes.
    """
    from websockets.asyncio.client import unix_connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    await receive()  # websocket.connect
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}
    host = headers.get("host", "localhost")
    target = scope.get("raw_path", b"").decode("latin-1") or scope["path"]
    if scope.get("query_string"):
        target += "?" + scope["query_string"].decode("latin-1")
    forwarded = [(k, v) for k, v in headers.items() if k in _WS_FORWARD]
    protocols = scope.get("subprotocols") or None
    try:
        upstream = await unix_connect(
            socket_path,
            f"ws://{host}{target}",
            additional_headers=forwarded,
            origin=headers.get("origin"),
            subprotocols=protocols,
            open_timeout=30,
            max_size=None,
            compression=None,
        )
    except InvalidStatus as exc:
        await _deny(scope, send, exc.response.status_code, bytes(exc.response.body or b""))
        return
    except (OSError, TimeoutError):
        await _deny(
            scope,
            send,
            502,
            b'{"error":{"message":"the engine process is unavailable",'
            b'"type":"engine_unavailable","param":null,"code":"engine_unavailable"}}',
        )
        return
    await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})

    async def up() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is not None:
                await upstream.send(message["text"])
            elif message.get("bytes") is not None:
                await upstream.send(message["bytes"])

    async def down() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for frame in upstream:
                key = "text" if isinstance(frame, str) else "bytes"
                await send({"type": "websocket.send", key: frame})
        code = upstream.close_code or 1000
        with contextlib.suppress(Exception):
            await send({"type": "websocket.close", "code": code})

    tasks = {asyncio.ensure_future(up()), asyncio.ensure_future(down())}
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await upstream.close()


#: Handshake headers the child's ``/ws/chat`` checks (Host and Origin are set apart).
_WS_FORWARD = frozenset({"authorization", "x-api-key", "cookie", "user-agent"})


async def _deny(scope: Scope, send: Send, status: int, body: bytes) -> None:
    """Refuse a WebSocket handshake with ``status`` and ``body``."""
    if "websocket.http.response" in scope.get("extensions", {}):
        await send(
            {
                "type": "websocket.http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})

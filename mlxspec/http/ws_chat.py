"""``/ws/chat``: the web chat's WebSocket, answered beside Connexion.

Connexion routes HTTP only, so :class:`ChatSocketMount` takes the ASGI
``websocket`` scopes before it (a plain ``GET /ws/chat`` still reaches the
document's ``openChatSocket`` operation, a 426). The handshake applies the
API's rules, in this order:

- **Host**: the HTTP edge's rule (:mod:`mlxspec.http.guard`, which passes
  WebSocket scopes through): on a loopback bind a ``Host`` other than
  ``localhost``, ``127.0.0.1``, ``[::1]``, the bind address or an
  ``--allowed-hosts`` name is ``403 host_not_allowed`` (DNS rebinding).
- **Origin** (cross-site WebSocket hijacking: browsers let any page open a
  socket to any server, and send its cookies): a browser's ``Origin`` must be
  the server's own (its host and port are the ``Host`` the request came to)
  or one of ``--allowed-origins``. Refused: ``403 origin_not_allowed``, before
  the upgrade.
- **API key**: a handshake ``Authorization: Bearer`` or ``x-api-key`` header
  that is wrong is a ``401``; without one, the socket opens, the server sends
  ``auth_required`` and the first frame must be ``auth`` with the key (a
  browser cannot set headers on a WebSocket), else an ``error`` frame and
  close code :data:`CLOSE_UNAUTHORIZED`.

The sessions database opens at the first connection, so an app that never
serves the chat never creates it.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import logging
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from connexion.context import _scope as connexion_scope
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from mlxspec.engine import cache_dir
from mlxspec.errors import ApiError, error_json
from mlxspec.handlers.webchat.frames import FrameError, dump_frame, error_frame, read_frame
from mlxspec.handlers.webchat.hub import ChatHub
from mlxspec.handlers.webchat.sessions import ChatStore
from mlxspec.handlers.webchat.socket import ChatSocket
from mlxspec.http.guard import RequestGuard
from mlxspec.http.security import key_refusal

__all__ = ["CHAT_PATH", "CLOSE_UNAUTHORIZED", "ChatSocketMount", "chat_db_path", "origin_refusal"]

log = logging.getLogger("mlxspec.http.ws_chat")

#: Set in the connection's task when its handshake was refused with a response.
_DENIED: contextvars.ContextVar[bool] = contextvars.ContextVar("ws_chat_denied", default=False)


class _DenialLogFilter(logging.Filter):
    """Drops uvicorn's "returned without completing handshake" error after a
    handshake this module refused with an HTTP response (the ASGI denial
    response): uvicorn's websockets-sansio protocol logs it although the
    refusal was sent. The app runs inside uvicorn's connection task, so the
    flag set there is still visible when uvicorn logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_DENIED.get() and "without completing handshake" in record.getMessage())


logging.getLogger("uvicorn.error").addFilter(_DenialLogFilter())

CHAT_PATH = "/ws/chat"
#: Close code for a missing or wrong key (4000-4999 are the application's,
#: RFC 6455 section 7.4.2; 4401 reads as HTTP's 401).
CLOSE_UNAUTHORIZED = 4401
#: Close code when the server cannot serve the chat (RFC 6455 "Internal Error").
CLOSE_INTERNAL = 1011
#: Seconds a keyed server waits for the ``auth`` frame.
AUTH_TIMEOUT_S = 30.0


def chat_db_path(config: Any) -> Path:
    """The sessions database: ``--chat-db``, else ``chat.sqlite3`` in mlxspec's
    cache folder (``MLXSPEC_CACHE_DIR``, else ``~/.cache/mlxspec``)."""
    configured = getattr(config, "chat_db", None)
    return Path(configured).expanduser() if configured else cache_dir() / "chat.sqlite3"


def origin_refusal(headers: Headers, config: Any) -> str | None:
    """Why a handshake's ``Origin`` may not open the socket, or ``None``.

    The ``Host`` itself was checked first (:class:`~mlxspec.http.guard.RequestGuard`'s
    rule: on a loopback bind, a rebound name is refused there), so an origin
    whose host and port are that ``Host`` is the server's own page.

    Args:
        headers (Headers): the handshake's headers.
        config (ServeConfig): ``allowed_origins``.

    Returns:
        str | None: the refusal's message; ``None`` to go on (also for a client
        that sends no ``Origin``: not a browser page, left to the key check).
    """
    origin = headers.get("origin")
    if origin is None:
        return None
    allowed = {o.rstrip("/") for o in config.allowed_origins}
    if "*" in allowed or origin.rstrip("/") in allowed:
        return None
    parts, host = urlsplit(origin), headers.get("host", "")
    if parts.scheme in ("http", "https") and parts.netloc.lower() == host.strip().lower():
        return None
    return f"Origin {origin!r} may not open {CHAT_PATH}: allow it with --allowed-origins"


class ChatSocketMount:
    """ASGI layer serving ``/ws/chat`` WebSockets; everything else goes to ``app``.

    Args:
        app: the HTTP app (Connexion and its wrappers).
        engine (Engine): the serving engine.
        config (ServeConfig): the server's settings.
        metrics (Metrics): the app's metrics (turns are timed like HTTP requests).
        transcription (bool): a Whisper service is configured (``ready.transcription``).
            Default: ``False``.
    """

    def __init__(
        self, app: ASGIApp, engine: Any, config: Any, metrics: Any, transcription: bool = False
    ) -> None:
        self.app, self.engine, self.config, self.metrics = app, engine, config, metrics
        self.transcription = transcription
        self._hub: ChatHub | None = None
        # The HTTP edge's Host rule, which passes WebSocket scopes on untouched.
        self.guard = RequestGuard(app, config)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket":
            await self.app(scope, receive, send)
            return
        if (await receive())["type"] != "websocket.connect":
            return
        headers = Headers(scope=scope)
        if scope.get("path") != CHAT_PATH:
            await _deny(scope, send, ApiError("not_found", "not found"))
            return
        if (refused := self.guard.refusal(scope)) is not None:  # a Host not answered
            await _deny(scope, send, refused)
            return
        if (refusal := origin_refusal(headers, self.config)) is not None:
            await _deny(scope, send, ApiError("origin_not_allowed", refusal))
            return
        key = self.config.api_key
        sent = headers.get("authorization") or headers.get("x-api-key")
        if key is not None and sent and (refusal := key_refusal(_Request(headers), key)):
            await _deny(scope, send, ApiError("unauthorized", refusal))
            return
        await send({"type": "websocket.accept"})
        try:
            hub = await self.hub()
        except Exception:
            log.exception("cannot open the web chat's sessions database")
            gone = ApiError("unavailable", "chat sessions unavailable")
            await _send_frame(send, error_frame(gone))
            await send({"type": "websocket.close", "code": CLOSE_INTERNAL})
            return
        if key is not None and not sent and not await _authenticate(receive, send, key):
            return
        # The turn pipeline reads the request's headers and the app's state
        # through Connexion's request context; a socket is its request here.
        state = {"engine": self.engine, "config": self.config, "metrics": self.metrics}
        connexion_scope.set({**scope, "state": state})
        socket = ChatSocket(hub, lambda text: send({"type": "websocket.send", "text": text}))
        await _serve(socket, receive)

    async def hub(self) -> ChatHub:
        """The sockets' shared state, the database opened on first use."""
        if self._hub is None:
            store = await asyncio.to_thread(ChatStore, chat_db_path(self.config))
            cap = self.engine.stats_snapshot().enforced_context  # the operator's, if any
            window = cap or self.engine.info.context_window
            if self._hub is None:  # another connection may have opened it meanwhile
                self._hub = ChatHub(
                    self.engine, store, window, self.transcription, config=self.config
                )
            else:
                store.close()
        return self._hub


class _Request:
    """What :func:`~mlxspec.http.security.key_refusal` reads of a request."""

    def __init__(self, headers: Headers) -> None:
        self.headers = headers


async def _serve(socket: ChatSocket, receive: Receive) -> None:
    """The frame loop of an open, authenticated socket."""
    await socket.open()
    try:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                break
            await socket.receive(message)
    finally:
        await socket.close()


async def _authenticate(receive: Receive, send: Send, key: str) -> bool:
    """Ask for the key and read the ``auth`` frame; on failure say why and close."""
    await _send_frame(send, {"type": "auth_required"})
    try:
        message = await asyncio.wait_for(receive(), AUTH_TIMEOUT_S)
    except TimeoutError:
        message = {"type": "websocket.receive", "text": ""}
    if message["type"] == "websocket.disconnect":
        return False
    try:
        frame = read_frame(message)
    except FrameError:
        frame = {}
    given = frame.get("key") if frame.get("type") == "auth" else None
    if isinstance(given, str) and hmac.compare_digest(given.encode(), key.encode()):
        return True
    message_text = "invalid API key" if given is not None else "send an auth frame with the API key"
    await _send_frame(send, error_frame(ApiError("unauthorized", message_text)))
    await send({"type": "websocket.close", "code": CLOSE_UNAUTHORIZED, "reason": "unauthorized"})
    return False


async def _send_frame(send: Send, frame: dict[str, Any]) -> None:
    await send({"type": "websocket.send", "text": dump_frame(frame)})


async def _deny(scope: Scope, send: Send, err: ApiError) -> None:
    """Refuse a handshake with ``err`` as a JSON HTTP response where the server
    supports the ASGI denial response, else with a bare close (uvicorn: 403)."""
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    _DENIED.set(True)
    body = error_json(err).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "websocket.http.response.start", "status": err.status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": body})

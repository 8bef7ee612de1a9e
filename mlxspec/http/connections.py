"""HTTP connections: uvicorn's httptools protocol with the limits a server on a
network needs, and the ``uvicorn.Config`` that ``mlxspec serve`` runs.

uvicorn 0.54 bounds a connection only while it is idle between requests
(``timeout_keep_alive``, armed after a response). A connection that never sends
a request, or never finishes its request line and headers, was held forever,
and httptools buffers a header of any size (a 200 MB header was read whole).
:class:`EdgeProtocol` extends ``HttpToolsProtocol`` with:

- a header timeout: the request line and headers must arrive within
  ``header_timeout`` seconds of the connection opening (or of the first byte of
  a later request on a kept-alive connection); else 408 if part of them came,
  or a silent close if nothing did (Node's ``headersTimeout``, Apache's
  ``mod_reqtimeout``);
- a header size limit: the request target and header fields over
  ``max_header_bytes`` are a 431 (RFC 6585 section 5), detected while they
  arrive, so at most one read buffer more is ever held;
- a connection cap: a connection beyond ``max_connections`` open ones gets a
  503 ``too_many_connections`` once its headers arrive (or after a second) and
  is closed. uvicorn's ``limit_concurrency`` counts connections and tasks
  together and answers ``text/plain``; this counts admitted connections only;
- framing errors (a non-numeric ``Content-Length``, ``Content-Length`` with
  chunked ``Transfer-Encoding``, RFC 9112 section 6.3) answered 400
  ``malformed_request`` instead of uvicorn's plain-text 400.

Every answer is JSON in the envelope of the request path's surface
(:mod:`mlxspec.errors`), with ``Connection: close``. Idle keep-alive
connections are closed by uvicorn's own ``timeout_keep_alive``.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from mlxspec.errors import ApiError, error_json, error_status, surface_for_path
from mlxspec.http.access_log import access_log_config

__all__ = ["ConnectionLimits", "EdgeProtocol", "bind_unix", "edge_protocol", "uvicorn_config"]

log = logging.getLogger("mlxspec.http.connections")

#: Seconds a connection over the cap may take to send its request headers before
#: it is answered 503 anyway (a second: enough for any client that sends at once,
#: short enough that a flood of idle sockets does not hold descriptors).
OVER_CAP_GRACE_S = 1.0
#: Seconds a refused connection is still read (and the bytes dropped) after the
#: answer, before it is closed: closing with unread bytes makes the kernel reset
#: the connection, and the client may lose the answer (nginx's ``lingering_close``).
LINGER_S = 2.0


@dataclass(frozen=True)
class ConnectionLimits:
    """Per-connection limits of :class:`EdgeProtocol`.

    Args:
        header_timeout (float): seconds for a request line and headers to
            arrive. Default: ``30.0``.
        max_header_bytes (int): most bytes of request target plus header names
            and values. Default: 64 KiB.
        max_connections (int | None): most connections served at once; ``None``
            for no cap. Default: ``1000``.
    """

    header_timeout: float = 30.0
    max_header_bytes: int = 64 * 2**10
    max_connections: int | None = 1000


class _Refused(Exception):
    """Raised inside a parser callback to stop httptools; the answer is ``_refusal``."""


class EdgeProtocol(HttpToolsProtocol):
    """``uvicorn``'s ``HttpToolsProtocol`` with :class:`ConnectionLimits`.

    Use :func:`edge_protocol` to bind limits; this class carries the defaults.
    """

    limits = ConnectionLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None  # the header or linger deadline
        self._in_head = False  # a request's first byte came, its headers have not ended
        self._head_bytes = 0  # bytes read of that head, after the read that began it
        self.over_cap = False
        self._refusal: ApiError | None = None
        self._lingering = False

    # -- connection life

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        cap = self.limits.max_connections
        if cap is not None and len(self.connections) > cap:
            admitted = sum(1 for c in self.connections if not getattr(c, "over_cap", False))
            self.over_cap = admitted > cap
        wait = self.limits.header_timeout
        self._arm_timer(min(wait, OVER_CAP_GRACE_S) if self.over_cap else wait)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return
        self._unset_keepalive_if_required()
        counted = self._in_head  # the read that begins a head is not counted (see limits)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # as uvicorn handles it
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        except httptools.HttpParserError as exc:
            why = f"malformed HTTP request: {exc}"
            self._refuse(self._refusal or ApiError("malformed_request", why))
            return
        if self._in_head and counted:
            self._head_bytes += len(data)
            if self._head_bytes > self.limits.max_header_bytes:
                self._refuse(self._too_large())

    # -- parser callbacks

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head, self._head_bytes = True, 0
        if self._timer is None:  # a later request on a kept-alive connection
            self._arm_timer(self.limits.header_timeout)

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._cancel_timer()
        size = len(self.url) + sum(len(name) + len(value) for name, value in self.headers)
        if size > self.limits.max_header_bytes:
            self._refusal = self._too_large()
            raise _Refused
        if self.over_cap:
            self._refusal = _over_cap(self.limits.max_connections)
            raise _Refused
        super().on_headers_complete()

    # -- timers and refusals

    def _arm_timer(self, seconds: float) -> None:
        self._cancel_timer()
        self._timer = self.loop.call_later(seconds, self._head_timeout)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_timeout(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self.over_cap:
            self._refuse(_over_cap(self.limits.max_connections))
        elif self._in_head:
            wait = self.limits.header_timeout
            self._refuse(
                ApiError("request_timeout", f"the request headers did not arrive within {wait:g} s")
            )
        else:  # nothing was sent: close as an idle keep-alive connection is closed
            self.transport.close()

    def _too_large(self) -> ApiError:
        limit = self.limits.max_header_bytes
        return ApiError("headers_too_large", f"request line and headers exceed {limit} bytes")

    def _refuse(self, err: ApiError) -> None:
        """Answer ``err``, then close once the client has read it (or after
        :data:`LINGER_S`); a response already under way is only cut off."""
        self._in_head = False
        self._cancel_timer()
        if self.transport.is_closing() or self._lingering:
            return
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()
            return
        log.info("%s %d: %s", _peer(self.client), err.status, err.message)
        self.transport.write(self._response(err))
        self._lingering = True
        if self.transport.can_write_eof():
            self.transport.write_eof()  # the client reads the answer, then its end
        self._timer = self.loop.call_later(LINGER_S, self.transport.close)

    def _response(self, err: ApiError) -> bytes:
        surface = surface_for_path(self._path())
        body = error_json(err, surface).encode()
        status = error_status(err, surface)
        lines = [STATUS_LINE[status]]
        extra = [(k.lower().encode(), v.encode()) for k, v in err.headers.items()]
        for name, value in self.server_state.default_headers + extra:
            lines += [name, b": ", value, b"\r\n"]
        lines += [
            b"content-type: application/json\r\n",
            b"content-length: %d\r\n" % len(body),
            b"connection: close\r\n\r\n",
            body,
        ]
        return b"".join(lines)

    def _path(self) -> str:
        """The path of the request being read, as far as it came ("" if unreadable)."""
        try:
            return httptools.parse_url(getattr(self, "url", b"") or b"/").path.decode("latin-1")
        except httptools.HttpParserInvalidURLError:
            return ""


def _over_cap(cap: int | None) -> ApiError:
    return ApiError(
        "too_many_connections",
        f"the server has {cap} open connections, its --max-connections; retry later",
        headers={"Retry-After": "1"},
    )


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "client"


def edge_protocol(limits: ConnectionLimits) -> type[EdgeProtocol]:
    """:class:`EdgeProtocol` bound to ``limits``, for ``uvicorn.Config(http=...)``.

    Args:
        limits (ConnectionLimits): the limits every connection gets.

    Returns:
        type[EdgeProtocol]: a subclass whose ``limits`` are ``limits``.
    """
    return type("EdgeProtocol", (EdgeProtocol,), {"limits": limits})


def uvicorn_config(app: Any, config: Any, **overrides: Any) -> Any:
    """The ``uvicorn.Config`` serving ``app`` with ``config``'s address and limits.

    Args:
        app: the ASGI app (:func:`mlxspec.http.app.create_app`).
        config (ServeConfig): ``host``, ``port``, ``log_level``,
            ``header_timeout``, ``keep_alive_timeout``, ``max_header_bytes``
            and ``max_connections`` apply.
        **overrides: more ``uvicorn.Config`` arguments (``timeout_graceful_shutdown``, ...).

    Returns:
        uvicorn.Config: with :class:`EdgeProtocol` as its HTTP protocol.
    """
    import uvicorn

    limits = ConnectionLimits(
        header_timeout=config.header_timeout,
        max_header_bytes=config.max_header_bytes,
        max_connections=config.max_connections or None,
    )
    options = {
        "host": config.host,
        "port": config.port,
        "log_level": config.log_level,
        "http": edge_protocol(limits),
        "timeout_keep_alive": config.keep_alive_timeout,
        "log_config": access_log_config(),  # access lines name the error of a 4xx/5xx
        **overrides,
    }
    return uvicorn.Config(app, **options)


def bind_unix(path: str) -> Any:
    """A listening unix socket at ``path`` that only this user may connect to.

    uvicorn's own ``uds`` binding leaves the socket file mode 0666; a worker
    socket (``--unix``) carries the engine's admin routes, so it is created
    under a umask that keeps it 0600 from the first moment.

    Args:
        path (str): the socket file; a stale one left by a dead server is replaced.

    Returns:
        socket.socket: bound and listening; pass it to ``uvicorn.Server.run(sockets=...)``.

    Raises:
        OSError: the path cannot be bound (a directory, no permission, too long).
    """
    import os
    import socket
    import stat

    if os.path.exists(path) and stat.S_ISSOCK(os.stat(path).st_mode):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(path)
    except OSError:
        sock.close()
        raise
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(2048)
    return sock

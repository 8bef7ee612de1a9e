"""Requests a web page in a browser could forge: ``Host`` and ``Origin`` checks.

A server on loopback is reachable from every page the user's browser opens. A
page on another site can send a "simple" cross-origin request (no preflight),
and with DNS rebinding (its own name re-pointed at 127.0.0.1) it can also read
the answers. Ollama and llama.cpp's server answer this with a ``Host`` allow
list; mlxspec does the same, plus an ``Origin`` check on the operator routes.
:class:`RequestGuard`, the outermost ASGI layer, refuses with 403 in the
envelope of the path's surface:

- a ``Host`` whose name is not ``localhost``, ``127.0.0.1``, ``[::1]``, the bound
  address or one of ``--allowed-hosts`` (any port), when the server binds a
  loopback address (:func:`binds_loopback`) or ``--allowed-hosts`` is given
  (``host_not_allowed``). A server bound to ``0.0.0.0`` or a LAN address is
  meant to be reached by names it cannot know, so it checks only on request;
- on ``/admin/*``, the jobs routes (``/api/jobs``, ``/api/finetune/*``,
  ``/api/quantize/*``, ``/api/dataset/*``) and the model library's routes
  (:data:`OPERATOR_PREFIXES`, :data:`OPERATOR_PATHS`: ``/library``, ``/downloads``,
  ``/api/hub/*``, ``/api/gc/*``, ``/api/model/*``), an ``Origin`` whose host is none
  of those names and which is not one of ``--allowed-origins``
  (``origin_not_allowed``): a page could otherwise flush the prompt cache with a
  body-less ``fetch``, start a job, or start downloads and GCs.

The other half, a POST body must carry a ``Content-Type`` the route declares, is
checked where the body is read (:mod:`mlxspec.http.app`): a simple request can only
send ``text/plain``, form or multipart types, so a JSON route needs a preflight,
which a server without ``--allowed-origins`` refuses.
"""

from __future__ import annotations

import ipaddress
import socket
from typing import Any
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

from mlxspec.errors import ApiError, send_error

__all__ = ["RequestGuard", "allowed_host_names", "binds_loopback", "host_name"]

#: Names every server answers to (RFC 6761 section 6.3's ``localhost``, the
#: loopback addresses), with any port.
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "[::1]"})
#: Path prefixes of the operator routes a foreign ``Origin`` may not call: ``/admin``,
#: the jobs routes (they run commands and read paths, ``--jobs``) and the model library.
OPERATOR_PREFIXES = (
    "/admin/", "/api/jobs", "/api/finetune/", "/api/quantize/", "/api/dataset/",
    "/api/hub/", "/api/gc/", "/api/model/",
)  # fmt: skip
#: Whole paths of the model library's operator routes.
OPERATOR_PATHS = frozenset({"/library", "/downloads"})


def binds_loopback(host: str) -> bool:
    """Whether a server listening on ``host`` is reachable only from this machine.

    Args:
        host (str): the bind address (``--host``): an IP address or a name.

    Returns:
        bool: ``True`` for ``localhost`` and for addresses (or names that
        resolve only to addresses) in 127.0.0.0/8 or ``::1``.
    """
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def host_name(value: str) -> str:
    """The name part of a ``Host`` header or URL authority, in lower case,
    without a port or a final ``.``; IPv6 addresses keep their brackets.

    Args:
        value (str): e.g. ``"LocalHost:8080"``, ``"[::1]:80"``, ``"::1"``.

    Returns:
        str: e.g. ``"localhost"``, ``"[::1]"``.
    """
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    if value.count(":") > 1:  # a bare IPv6 address (a bind address, never a Host)
        return f"[{value}]"
    return value.partition(":")[0].rstrip(".")


def allowed_host_names(config: Any) -> frozenset[str] | None:
    """The ``Host`` names a server with ``config`` answers, or ``None`` for any.

    Args:
        config (ServeConfig): ``host`` (the bind address) and ``allowed_hosts``.

    Returns:
        frozenset[str] | None: :data:`LOOPBACK_NAMES`, the bind address and
        ``allowed_hosts`` (as :func:`host_name` reads them); ``None`` when
        ``allowed_hosts`` holds ``*``, or is empty and the server binds beyond
        loopback.
    """
    extra = tuple(config.allowed_hosts)
    if "*" in extra or (not extra and not binds_loopback(config.host)):
        return None
    return LOOPBACK_NAMES | {host_name(config.host)} | {host_name(h) for h in extra}


class RequestGuard:
    """ASGI middleware refusing forged requests (see the module docstring).

    Args:
        app: the ASGI app to wrap.
        config (ServeConfig): ``host``, ``allowed_hosts`` and ``allowed_origins``.
    """

    def __init__(self, app: ASGIApp, config: Any) -> None:
        self.app = app
        self.hosts = allowed_host_names(config)
        self.origins = frozenset(o.rstrip("/") for o in config.allowed_origins)
        # Origins whose host may call /admin/* (the default names also when Host is unchecked).
        self.origin_hosts = self.hosts or LOOPBACK_NAMES | {host_name(config.host)}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (err := self.refusal(scope)) is not None:
            await send_error(scope, send, err)
            return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope) -> ApiError | None:
        """Why the request of ``scope`` is refused, or ``None`` to pass it on."""
        raw = scope.get("headers") or []
        if self.hosts is not None:  # every Host sent (a request should have one)
            for name in (host_name(v.decode("latin-1")) for k, v in raw if k == b"host"):
                if name not in self.hosts:
                    return ApiError(
                        "host_not_allowed",
                        f"Host {name!r} is not allowed: this server answers "
                        f"{', '.join(sorted(self.hosts))}; add names with --allowed-hosts",
                    )
        path = scope.get("path", "")
        if path.startswith(OPERATOR_PREFIXES) or path in OPERATOR_PATHS:
            for text in (v.decode("latin-1").strip() for k, v in raw if k == b"origin"):
                if not self._origin_allowed(text):
                    return ApiError(
                        "origin_not_allowed",
                        f"Origin {text!r} may not call {_route_kind(path)} routes: "
                        "allow it with --allowed-origins",
                    )
        return None

    def _origin_allowed(self, origin: str) -> bool:
        if "*" in self.origins or origin.rstrip("/") in self.origins:
            return True
        parts = urlsplit(origin)  # "null" (a sandboxed or file: page) has no host
        return bool(parts.netloc) and host_name(parts.netloc) in self.origin_hosts


def _route_kind(path: str) -> str:
    """How a refusal names the operator routes ``path`` belongs to."""
    if path.startswith("/admin/"):
        return "/admin"
    for prefix in ("/api/jobs", "/api/finetune/", "/api/quantize/", "/api/dataset/"):
        if path.startswith(prefix):
            return prefix.rstrip("/")
    return "model library"

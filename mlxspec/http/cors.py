"""CORS for ``--allowed-origins``: Starlette's middleware, with refusals in the
API's error envelope.

Starlette answers a preflight it refuses (an origin, method, header or private
network access not allowed) with a plain-text 400 ``Disallowed CORS origin``;
every other error of this server is JSON in its surface's envelope
(:mod:`mlxspec.errors`), so :class:`ApiCORSMiddleware` renders the refusal as a
``cors_refused`` error instead. Allowed preflights and simple requests are
Starlette's, unchanged.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from mlxspec.errors import ApiError, error_json, error_status, surface_for_path

__all__ = ["ApiCORSMiddleware"]

#: Starlette's refusal text, followed by the comma-separated names of what failed.
_REFUSED = "Disallowed CORS "


class ApiCORSMiddleware(CORSMiddleware):
    """``starlette.middleware.cors.CORSMiddleware`` whose refused preflights are
    ``cors_refused`` errors (400) in the envelope of the request path's surface.

    Args:
        app: the ASGI app to wrap.
        **kwargs: ``CORSMiddleware``'s options (``allow_origins``, ...).
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope) if scope["type"] == "http" else None
        # Starlette's test for a preflight (CORSMiddleware.__call__)
        if (
            headers is not None
            and scope["method"] == "OPTIONS"
            and "origin" in headers
            and "access-control-request-method" in headers
        ):
            response = self.preflight_response(request_headers=headers)
            if response.status_code >= 400:
                response = _refused(response, headers, scope.get("path", ""))
            await response(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _refused(response: Response, request_headers: Headers, path: str) -> Response:
    """Starlette's refused preflight as a ``cors_refused`` error in the envelope
    of ``path``'s surface, with Starlette's CORS headers (no
    ``Access-Control-Allow-Origin`` for an origin not allowed: the browser still
    blocks the request)."""
    err = ApiError("cors_refused", _refusal(bytes(response.body).decode(), request_headers))
    surface = surface_for_path(path)
    kept = {
        k: v for k, v in response.headers.items() if k not in ("content-type", "content-length")
    }
    return Response(
        error_json(err, surface),
        status_code=error_status(err, surface),
        headers=kept,
        media_type="application/json",
    )


def _refusal(text: str, request_headers: Headers) -> str:
    """The client-facing message for Starlette's refusal ``text``, naming what failed."""
    failed = text[len(_REFUSED) :].split(", ") if text.startswith(_REFUSED) else []
    what = {
        "origin": f"origin {request_headers.get('origin', '')!r}",
        "method": f"method {request_headers.get('access-control-request-method', '')!r}",
        "headers": f"request headers {request_headers.get('access-control-request-headers', '')!r}",
        "private-network": "private network access",
    }
    named = [what.get(name, name) for name in failed]
    if not named:
        return "CORS preflight refused"
    verb = "is" if len(named) == 1 else "are"
    return f"CORS preflight refused: {', '.join(named)} {verb} not allowed"

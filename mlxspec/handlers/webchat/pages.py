"""The web chat's HTTP routes (the document's ``web`` operations): the static
shell, its assets, the manifest, the service worker, the legacy page paths
and the ``426`` of a plain ``GET /ws/chat`` (the upgrade itself is answered by
:mod:`mlxspec.http.ws_chat`, before Connexion)."""

from __future__ import annotations

from connexion.context import scope
from starlette.responses import RedirectResponse, Response

from mlxspec.errors import ApiError
from mlxspec.web import static_file

#: The page's Content-Security-Policy: every script, style, image and socket
#: same-origin (no CDN, and a page that injected markup could load nothing),
#: no plugins, no framing.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
    "form-action 'self'"
)


#: A transcription-only server's answer to the page's routes.
_NO_CHAT = (
    "this server serves speech to text only (mlxspec serve <whisper checkpoint>): "
    "the web chat needs a chat model; the API is at /v1/audio/*"
)


def _chat_served() -> None:
    """Raises:
    ApiError: ``not_found`` on a transcription-only server (no chat model)."""
    if scope["state"].get("engine") is None:
        raise ApiError("not_found", _NO_CHAT)


def _serve(route: str) -> Response:
    """The shipped file of ``route`` with its type and cache headers.

    Raises:
        ApiError: ``not_found`` when no file is shipped for it, or on a
            transcription-only server.
    """
    _chat_served()
    found = static_file(route)
    if found is None:
        raise ApiError("not_found", "not found")
    headers = {"Cache-Control": found.cache_control, "X-Content-Type-Options": "nosniff"}
    if route == "/":
        headers["Content-Security-Policy"] = CSP
    return Response(found.body, media_type=found.media_type, headers=headers)


async def get_web_app() -> Response:
    """``GET /``: the page."""
    return _serve("/")


async def get_web_asset(asset: str) -> Response:
    """``GET /assets/{asset}``: a script, style sheet, icon or licence of the page."""
    return _serve(f"/assets/{asset}")


async def get_web_manifest() -> Response:
    """``GET /manifest.webmanifest``: the Web App Manifest."""
    return _serve("/manifest.webmanifest")


async def get_service_worker() -> Response:
    """``GET /sw.js``: the service worker (``no-store``)."""
    return _serve("/sw.js")


async def redirect_chat_page() -> Response:
    """``GET /chat``: the reference's legacy page path, now a hash route."""
    _chat_served()
    return RedirectResponse("/#chat", status_code=302)


async def redirect_status_page() -> Response:
    """``GET /status``: the page's status view."""
    _chat_served()
    return RedirectResponse("/#status", status_code=302)


async def open_chat_socket() -> None:
    """``GET /ws/chat`` without ``Upgrade: websocket``: a ``426``.

    Raises:
        ApiError: always ``upgrade_required``, with ``Upgrade: websocket``.
    """
    raise ApiError(
        "upgrade_required",
        "/ws/chat is a WebSocket: send the upgrade headers "
        "(Connection: Upgrade, Upgrade: websocket)",
        headers={"Upgrade": "websocket", "Connection": "Upgrade"},
    )

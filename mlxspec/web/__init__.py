"""The web chat's static shell: the page, its scripts, styles, icon, manifest
and service worker, served same-origin from this package (never a CDN).

Everything the browser loads lives in ``static/`` as plain files checked into
the repository: no build step runs before serving or testing them. Vendored
libraries (Markdown, syntax highlighting) and their licences are listed in
``VENDOR.md``. :func:`static_file` is the one lookup the page routes
(:mod:`mlxspec.handlers.webchat.pages`) use; cache headers follow the
reference's "Web app static routes + PWA installability" table.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ASSET_NAME", "STATIC_DIR", "StaticFile", "static_file"]

STATIC_DIR: Path = Path(__file__).with_name("static")
"""The folder of the files the web chat serves."""

#: An asset's file name: one path segment, no dot files (``/assets/{asset}``).
ASSET_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")

#: Cache headers (reference, "Web app static routes"): assets and the manifest
#: may be reused for an hour; the service worker never is, so a new one takes
#: over at the next visit; the shell is revalidated, so a new server's page
#: replaces an old one as soon as the network answers.
PUBLIC_HOUR = "public, max-age=3600"
NO_STORE = "no-store"
REVALIDATE = "no-cache"

#: File extension -> media type (RFC 9239 for JavaScript, W3C appmanifest).
_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".txt": "text/plain; charset=utf-8",
    ".webmanifest": "application/manifest+json",
}


@dataclass(frozen=True)
class StaticFile:
    """One file of the shell, read once.

    Args:
        body (bytes): the file's bytes.
        media_type (str): its ``Content-Type``.
        cache_control (str): its ``Cache-Control``.
    """

    body: bytes
    media_type: str
    cache_control: str


#: Shipped files number about a dozen; the bound keeps made-up names from
#: growing the cache.
@functools.lru_cache(maxsize=64)
def static_file(route: str) -> StaticFile | None:
    """The file a shell route serves, read from :data:`STATIC_DIR` on first use.

    Args:
        route (str): ``"/"``, ``"/manifest.webmanifest"``, ``"/sw.js"`` or
            ``"/assets/<name>"``.

    Returns:
        StaticFile | None: ``None`` when the route names no shipped file (an
        asset name outside :data:`ASSET_NAME`, or none by that name).
    """
    if route == "/":
        path, cache = STATIC_DIR / "index.html", REVALIDATE
    elif route == "/manifest.webmanifest":
        path, cache = STATIC_DIR / "manifest.webmanifest", PUBLIC_HOUR
    elif route == "/sw.js":
        path, cache = STATIC_DIR / "sw.js", NO_STORE
    elif route.startswith("/assets/") and ASSET_NAME.fullmatch(name := route[8:]):
        path, cache = STATIC_DIR / "assets" / name, PUBLIC_HOUR
    else:
        return None
    media = _MEDIA_TYPES.get(path.suffix)
    if media is None or not path.is_file():
        return None
    return StaticFile(path.read_bytes(), media, cache)

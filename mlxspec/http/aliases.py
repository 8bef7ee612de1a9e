"""Request paths answered as other paths of the document.

``mlx_lm.server`` answers ``POST /chat/completions`` besides
``/v1/chat/completions``, and clients configured for it (a base URL without
``/v1``) send the short forms. The document lists the aliases under
:data:`ALIASES_KEY`; :class:`PathAliases` rewrites such a request's path
before anything else sees it, so routing, validation, metrics and the contract
checks (:mod:`mlxspec.conformance.contract`) all treat it as the aliased path.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

#: The document's top-level map of alias -> path.
ALIASES_KEY = "x-mlxspec-path-aliases"


def path_aliases(spec: Mapping[str, Any]) -> dict[str, str]:
    """The document's aliases: request path -> the path it is answered as."""
    return dict(spec.get(ALIASES_KEY) or {})


class PathAliases:
    """ASGI middleware: a request to an alias is served as its path.

    Args:
        app (ASGIApp): the application.
        aliases (Mapping[str, str]): alias -> path (:func:`path_aliases`).
    """

    def __init__(self, app: ASGIApp, aliases: Mapping[str, str]) -> None:
        self.app = app
        self.aliases = dict(aliases)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        target = self.aliases.get(scope.get("path", "")) if scope["type"] == "http" else None
        if target is not None:
            scope = {**scope, "path": target, "raw_path": target.encode()}
        await self.app(scope, receive, send)

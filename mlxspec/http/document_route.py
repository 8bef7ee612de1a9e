"""``GET /openapi.json``: the OpenAPI document as written, its ``$ref``s kept.

Connexion 3.3 serves ``Specification.spec``, the document with every reference
expanded in place (about 660 KB against 180 KB, and no component names left), and
rebuilds it on each request (a clone that validates and resolves the whole
document again). A client generated from that gets one model per inline copy
(``CreateChatCompletionResponse200`` ...) instead of one per component.
:class:`DocumentMiddleware` serves ``Specification.raw`` instead, the document
the app was given (overlays and security applied), with only ``servers``
replaced, as Connexion does, under a path prefix; every ``$ref`` in it is local
(``#/components/...``), so the served JSON stands alone. Validation and routing
still use Connexion's resolved copy.
"""

from __future__ import annotations

import asyncio
from typing import Any

from connexion.jsonifier import Jsonifier
from connexion.middleware.swagger_ui import SwaggerUIAPI, SwaggerUIMiddleware
from connexion.spec import Specification
from connexion.utils import yamldumper
from starlette.requests import Request
from starlette.responses import Response

__all__ = ["DocumentAPI", "DocumentMiddleware"]

#: Connexion's own encoders (its ``Jsonifier`` also writes the dates YAML parses).
_DUMPS = {"application/json": Jsonifier().dumps, "text/yaml": yamldumper}


class DocumentAPI(SwaggerUIAPI):
    """Connexion's spec routes (``/openapi.json``, ``/openapi.yaml``) serving
    the unresolved document, each encoding made once per path prefix."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._encoded: dict[tuple[str, str], bytes] = {}

    def _spec_for_prefix(self, request: Request) -> dict[str, Any]:
        """The document as given to ``add_api``; under a path prefix (``root_path``,
        set by the server, never by a client) ``servers`` is that prefix alone."""
        prefix = self._base_path_for_prefix(request)
        raw = self.specification.raw
        return {**raw, "servers": [{"url": prefix}]} if prefix else raw

    async def _encode(self, request: Request, media_type: str) -> bytes:
        # The first encoding runs in a worker thread: PyYAML's pure-Python dumper
        # takes about a second on a small CPU, and both routes are public.
        key = (self._base_path_for_prefix(request), media_type)
        if key not in self._encoded:
            spec = self._spec_for_prefix(request)
            text = await asyncio.to_thread(_DUMPS[media_type], spec)
            self._encoded[key] = text.encode()
        return self._encoded[key]

    async def _get_openapi_json(self, request: Request) -> Response:
        body = await self._encode(request, "application/json")
        return Response(body, media_type="application/json")

    async def _get_openapi_yaml(self, request: Request) -> Response:
        return Response(await self._encode(request, "text/yaml"), media_type="text/yaml")


class DocumentMiddleware(SwaggerUIMiddleware):
    """Connexion's ``SwaggerUIMiddleware`` with :class:`DocumentAPI` spec routes
    (use it in place of the stock one in ``AsyncApp(middlewares=...)``)."""

    def add_api(
        self,
        specification: Specification,
        base_path: str | None = None,
        arguments: dict | None = None,
        **kwargs: Any,
    ) -> None:
        """Connexion's hook: mount the document's routes at the API's base path."""
        api = DocumentAPI(
            specification,
            base_path=base_path,
            arguments=arguments,
            default=self.default_fn,
            **kwargs,
        )
        self.router.mount(api.base_path, app=api.router)

"""Connexion's ASGI dispatch, with each operation's set-up done once.

Connexion 3.3's ``AsyncOperation`` builds its decorator chain on every
request: a ``StarletteDecorator``, the parameter decorator (which runs
``inspect.signature`` on the handler), the response decorator, and a URI
parser over the operation's parameters and body definition. None of that
depends on the request, only on the operation, so :class:`PreparedOperation`
builds it once when the API is added and each request only creates its
``ConnexionRequest`` and calls the chain, which still reads the request
through Connexion's context (``operation``, ``scope``, ``receive``) as before.
Routing, security and request validation are untouched: they run in
Connexion's middleware before the operation is called.

:func:`remember_body_definitions` does the same for the document lookup that
every middleware layer repeats per request: an operation's request body
definition for a content type (a ``MediaTypeDict`` built from the document and
matched with ``fnmatch``, about 8 times per request in Connexion 3.3).

:data:`MIDDLEWARES` and :func:`prepare_app` turn off Starlette's trailing-slash
redirects in every router of the stack (see :func:`exact_paths`).

:func:`remember_spec_routes` makes the document routes build their answer once.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from typing import Any

from connexion.apps.asynchronous import AsyncApi, AsyncApp, AsyncOperation
from connexion.context import receive, scope
from connexion.decorators import StarletteDecorator
from connexion.jsonifier import Jsonifier
from connexion.middleware.main import ConnexionMiddleware
from connexion.middleware.routing import RoutingMiddleware
from connexion.middleware.swagger_ui import SwaggerUIAPI, SwaggerUIMiddleware
from connexion.operations import AbstractOperation, OpenAPIOperation
from connexion.uri_parsing import AbstractURIParser
from connexion.utils import yamldumper
from starlette.responses import Response
from starlette.routing import Mount, Router


class _PreparedDecorator(StarletteDecorator):
    """``StarletteDecorator`` whose chain is built at decoration time, with one
    URI parser for every request (Connexion's parsers keep no request state)."""

    def __init__(self, uri_parser: AbstractURIParser, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._uri_parser = uri_parser

    def __call__(self, function: Callable) -> Callable:
        decorated = self.decorate(function)
        framework, uri_parser = self.framework, self._uri_parser

        @functools.wraps(function)
        async def wrapper() -> Any:
            request = framework.get_request(uri_parser=uri_parser, scope=scope, receive=receive)
            return await decorated(request)

        return wrapper


class PreparedOperation(AsyncOperation):
    """An ``AsyncOperation`` that decorates its handler once, not per request.

    Args:
        fn (Callable): the resolved handler.
        jsonifier (Jsonifier): encodes JSON responses.
        operation_id (str): the document's ``operationId``.
        pythonic_params (bool): Connexion's parameter-name conversion.
        uri_parser (AbstractURIParser): parses the operation's path, query
            and form parameters.
    """

    def __init__(
        self,
        fn: Callable,
        jsonifier: Jsonifier,
        operation_id: str,
        pythonic_params: bool,
        uri_parser: AbstractURIParser,
    ) -> None:
        super().__init__(fn, jsonifier, operation_id, pythonic_params)
        decorator = _PreparedDecorator(
            uri_parser, pythonic_params=pythonic_params, jsonifier=jsonifier
        )
        self._prepared = decorator(fn)

    @classmethod
    def from_operation(  # type: ignore[override]
        cls, operation: AbstractOperation, *, pythonic_params: bool, jsonifier: Jsonifier
    ) -> PreparedOperation:
        """The prepared operation of a document operation (Connexion's factory)."""
        uri_parser = operation.uri_parser_class(operation.parameters, operation.body_definition())
        return cls(
            operation.function,
            jsonifier=jsonifier,
            operation_id=operation.operation_id,
            pythonic_params=pythonic_params,
            uri_parser=uri_parser,
        )

    @property
    def fn(self) -> Callable:
        """The decorated handler, built once."""
        return self._prepared


class PreparedApi(AsyncApi):
    """Connexion's ``AsyncApi`` with :class:`PreparedOperation` operations; set it
    as the ``api_cls`` of an ``AsyncApp``'s routing app before ``add_api``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        exact_paths(self.router)

    def make_operation(self, operation: AbstractOperation) -> AsyncOperation:
        """Connexion's hook: one :class:`PreparedOperation` per document operation."""
        return PreparedOperation.from_operation(
            operation, pythonic_params=self.pythonic_params, jsonifier=self.jsonifier
        )


def remember_body_definitions() -> None:
    """Make ``OpenAPIOperation.body_definition`` compute each answer once per
    operation (idempotent; all Connexion apps of the process).

    The answer depends only on the operation's document and the content type,
    and Connexion returns the same dict object every time (it is the
    document's own media-type entry), so a remembered answer is that same
    object. Only the declared content types and ``None`` are remembered: a
    client can send any ``Content-Type``, and those stay uncached.
    """
    stock = OpenAPIOperation.body_definition
    if getattr(stock, "_mlxspec_remembered", False):
        return

    @functools.wraps(stock)
    def body_definition(self: OpenAPIOperation, content_type: str | None = None) -> dict:
        known = self.__dict__.setdefault("_mlxspec_body_definitions", {})
        if content_type in known:
            return known[content_type]
        found = stock(self, content_type)
        if content_type is None or content_type in self.consumes:
            known[content_type] = found
        return found

    body_definition._mlxspec_remembered = True  # type: ignore[attr-defined]
    OpenAPIOperation.body_definition = body_definition  # type: ignore[method-assign]


def remember_spec_routes() -> None:
    """Make Connexion's ``GET /openapi.json`` and ``GET /openapi.yaml`` build
    their answer once per base path, in a worker thread, instead of on the event
    loop per request (idempotent; all Connexion apps of the process).

    Connexion 3.3 copies and validates the whole document again for every
    request (``Specification.with_base_path``), and the YAML route then runs
    PyYAML's pure-Python dumper: about 1 s and 2 s of the event loop on an idle
    2-core machine, during which the server answered nothing else. Both routes
    are public, so anyone could stall the server with them.
    """
    if getattr(SwaggerUIAPI, "_mlxspec_remembered", False):
        return

    def route(dump: Callable[[Any], str], media_type: str) -> Callable:
        async def get(self: SwaggerUIAPI, request: Any) -> Response:
            base_path = self._base_path_for_prefix(request)
            specs = self.__dict__.setdefault("_mlxspec_specs", {})
            built = self.__dict__.setdefault("_mlxspec_documents", {})
            if (media_type, base_path) not in built:
                if base_path not in specs:
                    with_base = self.specification.with_base_path
                    specs[base_path] = (await asyncio.to_thread(with_base, base_path)).spec
                built[media_type, base_path] = await asyncio.to_thread(dump, specs[base_path])
            return Response(built[media_type, base_path], media_type=media_type)

        return get

    SwaggerUIAPI._get_openapi_json = route(Jsonifier().dumps, "application/json")  # type: ignore[method-assign]
    SwaggerUIAPI._get_openapi_yaml = route(yamldumper, "text/yaml")  # type: ignore[method-assign]
    SwaggerUIAPI._mlxspec_remembered = True  # type: ignore[attr-defined]


def exact_paths(router: Router) -> None:
    """Stop ``router``, and the routers mounted in it, from redirecting a path
    that differs from a route only by a trailing ``/``.

    Starlette answers ``GET /stats/`` with a 307 to ``/stats`` before Connexion's
    security runs, so a server with ``--api-key`` answered unauthenticated
    requests. Neither the reference nor llama.cpp's server nor vLLM redirects:
    the path is one no operation declares (404, or 401 without the key).

    Args:
        router (Router): a Starlette router, changed in place.
    """
    router.redirect_slashes = False
    for route in router.routes:
        if isinstance(route, Mount) and isinstance(route.app, Router):
            exact_paths(route.app)
    if isinstance(router.default, Router):
        exact_paths(router.default)


def _exact(base: type) -> type:
    """``base`` (a Connexion middleware owning a Starlette ``router``: the
    document route's, the operations') with :func:`exact_paths` applied to its
    router when made and after each ``add_api``."""

    class Exact(base):  # type: ignore[valid-type, misc]
        def __init__(self, app: Any) -> None:
            super().__init__(app)
            exact_paths(self.router)

        def add_api(self, *args: Any, **kwargs: Any) -> None:
            super().add_api(*args, **kwargs)
            exact_paths(self.router)

    Exact.__name__ = Exact.__qualname__ = f"_Exact{base.__name__}"
    return Exact


_EXACT = {base: _exact(base) for base in (SwaggerUIMiddleware, RoutingMiddleware)}

#: Connexion's default middleware stack with routers that never redirect (pass it
#: as ``AsyncApp(middlewares=...)``).
MIDDLEWARES = [_EXACT.get(m, m) for m in ConnexionMiddleware.default_middlewares]


def prepare_app(app: AsyncApp) -> None:
    """Give a new ``AsyncApp`` :class:`PreparedApi` operations and a dispatch
    router that never redirects; call it before ``add_api``."""
    routed = app._middleware_app  # the routing app Connexion keeps for AsyncApp
    routed.api_cls = PreparedApi  # type: ignore[attr-defined]
    exact_paths(routed.router)  # type: ignore[attr-defined]

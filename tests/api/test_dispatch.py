"""Prepared dispatch (:mod:`mlxspec.http.dispatch`): handlers are decorated once per
operation, and every request still gets its own path, query and body arguments."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import connexion
import httpx

from mlxspec.http.dispatch import PreparedApi, PreparedOperation
from mlxspec.openapi.validation import enable_openapi_31

SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "dispatch", "version": "1"},
    "paths": {
        "/items/{name}": {
            "post": {
                "operationId": "tests.api.test_dispatch.echo",
                "parameters": [
                    {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}},
                    {
                        "name": "times",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "integer", "default": 1},
                    },
                ],
                "requestBody": {
                    "required": True,
                    "content": {
                        "application/json": {
                            "schema": {
                                "type": "object",
                                "properties": {"word": {"type": "string"}},
                                "required": ["word"],
                            }
                        }
                    },
                },
                "responses": {"200": {"description": "the arguments"}},
            }
        }
    },
}


async def echo(name: str, body: dict[str, Any], times: int = 1) -> dict[str, Any]:
    """The test route's handler: its arguments back."""
    return {"name": name, "times": times, "word": body["word"]}


def _app() -> Any:
    enable_openapi_31()
    app = connexion.AsyncApp("dispatch")
    app._middleware_app.api_cls = PreparedApi
    app.add_api(SPEC)
    return app


def _operations(app: Any) -> list[Any]:
    """The routed operations (Connexion builds its APIs at the first request)."""
    apis = [api for apis in app._middleware_app.apis.values() for api in apis]
    return [op for api in apis for op in api.operations.values()]


def test_each_request_gets_its_own_arguments_from_one_prepared_handler() -> None:
    app = _app()
    handlers = []

    async def go() -> list[tuple[int, Any]]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            sent = [
                client.post("/items/a", json={"word": "x"}),
                client.post("/items/b-c?times=3", json={"word": "y"}),
                client.post("/items/d?times=2", json={"word": "z"}),
                client.post("/items/e?times=two", json={"word": "w"}),
                client.post("/items/f", json={}),
            ]
            first = await client.post("/items/first", json={"word": "v"})
            assert first.json() == {"name": "first", "times": 1, "word": "v"}
            handlers.append([op.fn for op in _operations(app)])
            return [(r.status_code, r.json()) for r in await asyncio.gather(*sent)]

    got = asyncio.run(go())
    assert got[:3] == [
        (200, {"name": "a", "times": 1, "word": "x"}),
        (200, {"name": "b-c", "times": 3, "word": "y"}),
        (200, {"name": "d", "times": 2, "word": "z"}),
    ]
    assert [status for status, _ in got[3:]] == [400, 400]
    (operation,) = _operations(app)
    assert isinstance(operation, PreparedOperation)
    # One decorated handler served every request (Connexion's AsyncOperation
    # builds a new one on each access of ``fn``).
    assert handlers == [[operation.fn]]
    handler = inspect.unwrap(operation.fn)
    assert (handler.__module__, handler.__qualname__) == ("tests.api.test_dispatch", "echo")


def test_body_definitions_are_remembered_for_declared_content_types_only() -> None:
    from connexion.operations import OpenAPIOperation
    from connexion.resolver import Resolver

    from mlxspec.http.dispatch import remember_body_definitions

    remember_body_definitions()
    remember_body_definitions()  # idempotent: one wrapper, not two
    wrapped = OpenAPIOperation.body_definition
    assert not hasattr(wrapped.__wrapped__, "__wrapped__")
    post = SPEC["paths"]["/items/{name}"]["post"]
    operation = OpenAPIOperation("post", "/items/{name}", post, Resolver())
    declared = post["requestBody"]["content"]["application/json"]
    assert operation.body_definition() is declared
    assert operation.body_definition("application/json") is declared
    assert operation.body_definition("text/plain") == {}
    assert operation.__dict__["_mlxspec_body_definitions"] == {
        None: declared,
        "application/json": declared,
    }

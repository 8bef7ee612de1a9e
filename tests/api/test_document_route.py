"""``GET /openapi.json`` (:mod:`mlxspec.http.document_route`): the document as the app
validates with, its component ``$ref``s kept, standing alone and valid OpenAPI 3.1."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import yaml
from openapi_spec_validator import validate

from mlxspec.openapi import served_spec


def _get(app: object, path: str, root_path: str = "") -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, root_path=root_path)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            return await client.get(path)

    return asyncio.run(go())


def _refs(node: Any) -> list[str]:
    if isinstance(node, dict):
        own = [node["$ref"]] if "$ref" in node else []
        return own + [ref for value in node.values() for ref in _refs(value)]
    if isinstance(node, list):
        return [ref for value in node for ref in _refs(value)]
    return []


def _follow(doc: dict[str, Any], ref: str) -> Any:
    node: Any = doc
    for part in ref.removeprefix("#/").split("/"):
        node = node[part.replace("~1", "/").replace("~0", "~")]
    return node


def test_served_document_keeps_its_local_refs(tiny_app: object) -> None:
    r = _get(tiny_app, "/openapi.json")
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    doc = r.json()
    assert doc == served_spec()  # as written: only overlays applied, nothing expanded
    refs = _refs(doc)
    assert len(refs) > 200
    assert all(ref.startswith("#/components/") for ref in refs)
    for ref in set(refs):
        assert isinstance(_follow(doc, ref), dict), ref
    validate(doc)  # OpenAPI 3.1, references resolved within the document itself
    assert doc["openapi"].startswith("3.1")


def test_yaml_route_serves_the_same_document(tiny_app: object) -> None:
    r = _get(tiny_app, "/openapi.yaml")
    assert r.status_code == 200
    assert yaml.safe_load(r.text) == _get(tiny_app, "/openapi.json").json()


def test_under_a_path_prefix_servers_is_the_prefix(tiny_app: object) -> None:
    doc = _get(tiny_app, "/base/openapi.json", root_path="/base").json()
    assert doc["servers"] == [{"url": "/base"}]
    assert {**doc, "servers": None} == {**served_spec(), "servers": None}
    assert _get(tiny_app, "/openapi.json").json()["servers"] == served_spec()["servers"]

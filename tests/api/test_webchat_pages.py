"""The web chat's HTTP routes: the shell, its assets, the manifest, the service
worker and the legacy redirects, each response checked against the document."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from mlxspec.config import ServeConfig
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.http.app import create_app
from mlxspec.web import STATIC_DIR
from tests.conftest import LiveServer

#: The page's own files (not the vendored libraries): no URL of another origin.
OWN_FILES = ["index.html", "sw.js", "manifest.webmanifest"] + [
    f"assets/{p.name}"
    for p in sorted((STATIC_DIR / "assets").iterdir())
    if p.suffix in (".js", ".css", ".svg") and not p.name.startswith(("hljs", "marked"))
]
#: URLs that name no resource (XML namespaces).
NAMESPACES = {"http://www.w3.org/2000/svg"}


def _shell(client: httpx.Client) -> list[str]:
    """The files the service worker caches, as sw.js lists them."""
    text = client.get("/sw.js").text
    return json.loads(re.search(r"const SHELL = (\[.*?\]);", text, re.S)[1].replace(",\n]", "]"))


def test_the_page_is_served_with_its_headers(client: httpx.Client) -> None:
    r = client.get("/")
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert r.headers["cache-control"] == "no-cache"
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "connect-src 'self'" in csp
    assert '<script type="module" src="/assets/app.js"></script>' in r.text
    assert client.head("/").status_code == 200


def test_every_file_the_page_loads_is_served_same_origin(client: httpx.Client) -> None:
    page = client.get("/").text
    refs = re.findall(r'(?:src|href)="([^"#]+)"', page)
    assert refs and all(ref.startswith("/") and not ref.startswith("//") for ref in refs), refs
    modules = [
        f"/assets/{name}"
        for p in (STATIC_DIR / "assets").glob("*.js")
        for name in re.findall(r'from "\./([\w.-]+)"', p.read_text())
    ]
    for path in {*refs, *modules, *_shell(client)} - {"/openapi.json"}:
        r = client.get(path)
        assert r.status_code == 200, path
        if path.startswith("/assets/"):
            assert r.headers["cache-control"] == "public, max-age=3600", path
            assert r.headers["x-content-type-options"] == "nosniff"
    assert client.get("/assets/app.js").headers["content-type"].startswith("text/javascript")
    assert client.get("/assets/app.css").headers["content-type"].startswith("text/css")
    assert client.get("/assets/icon.svg").headers["content-type"] == "image/svg+xml"
    assert client.get("/assets/LICENSE-marked.txt").text.startswith("# License information")


@pytest.mark.parametrize("name", OWN_FILES)
def test_the_pages_own_files_name_no_other_origin(name: str) -> None:
    text = (STATIC_DIR / name).read_text()
    urls = set(re.findall(r"\b(?:https?|wss?)://[^\s\"'`)<>]+", text)) - NAMESPACES
    assert not urls, urls


def test_the_service_worker_caches_only_the_shell(client: httpx.Client) -> None:
    r = client.get("/sw.js")
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["content-type"] == "text/javascript; charset=utf-8"
    shell = _shell(client)
    assert "/" in shell and "/assets/app.js" in shell
    assert not [p for p in shell if p.startswith(("/v1", "/ws", "/stats", "/fit", "/admin"))]
    shipped = {f"/assets/{p.name}" for p in (STATIC_DIR / "assets").iterdir()}
    assert {p for p in shipped if p.endswith((".js", ".css", ".svg"))} <= set(shell)


def test_the_manifest_makes_it_installable(client: httpx.Client) -> None:
    r = client.get("/manifest.webmanifest")
    assert r.headers["content-type"] == "application/manifest+json"
    assert r.headers["cache-control"] == "public, max-age=3600"
    manifest = r.json()
    assert manifest["start_url"] == "/" and manifest["display"] == "standalone"
    for icon in manifest["icons"]:
        assert client.get(icon["src"]).status_code == 200


@pytest.mark.parametrize(("path", "target"), [("/chat", "/#chat"), ("/status", "/#status")])
def test_legacy_page_paths_redirect_to_hash_routes(
    client: httpx.Client, path: str, target: str
) -> None:
    r = client.get(path)
    assert (r.status_code, r.headers["location"]) == (302, target)


@pytest.mark.parametrize(
    "path", ["/assets/nothing.js", "/assets/.hidden", "/assets/..%2Fsw.js", "/assets/app.py"]
)
def test_an_unknown_asset_is_a_404(client: httpx.Client, path: str) -> None:
    r = client.get(path)
    assert r.status_code == 404
    assert r.json()["error"]["type"] == "not_found_error"


def test_the_shell_is_public_on_a_keyed_server(tiny_engine: Any) -> None:
    with LiveServer(create_app(tiny_engine, ServeConfig(api_key="k"))) as server:
        with checking_client(server.base) as c:
            for path in ["/", "/assets/app.js", "/manifest.webmanifest", "/sw.js"]:
                assert c.get(path).status_code == 200, path
            assert c.get("/stats").status_code == 401  # the API is not

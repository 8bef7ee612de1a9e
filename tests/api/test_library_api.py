"""The model library's routes in process: ``/library``, ``/v1/models``' library
rows, GC, resolve-folder, the Origin guard and the API key (a fake engine, a hub
cache built in tmp_path)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxspec.config import ServeConfig
from mlxspec.engine import ModelInfo
from mlxspec.http.app import create_app
from tests.fakes import FakeEngine
from tests.library_cache import add_revision, commit_hash, tiny_config


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> object:
    from mlx_lm.tokenizer_utils import load

    return load(tiny_model_dir)


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hub"
    root.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "mlxspec"))
    add_revision(root, "org/served", commit_hash(1), {"config.json": tiny_config()}, ("main",))
    add_revision(
        root,
        "org/other",
        commit_hash(2),
        {"config.json": tiny_config("qwen3"), "model.safetensors": b"\0" * 4096},
        ("main",),
    )
    vlm = tiny_config("qwen2_vl", vision_config={"depth": 1})
    add_revision(root, "org/vlm", commit_hash(3), {"config.json": vlm}, ("main",))
    add_revision(root, "org/alien", commit_hash(4), {"config.json": tiny_config("nosuch")})
    for app in _APPS.values():  # a new cache: the shared apps scan again
        asyncio.run(_refresh(app))
    return root


async def _refresh(app: Any) -> None:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        await client.get("/library?refresh=1", headers={"Authorization": "Bearer k"})


_APPS: dict[Any, Any] = {}


def call(tokenizer: object, method: str, path: str, config: ServeConfig | None = None, **kw: Any):
    """One request to an app on a fake engine (one app per config for the
    module: building one costs seconds on a loaded machine)."""
    key = None if config is None else config.api_key
    if key not in _APPS:
        info = ModelInfo(id="org/served", context_window=4096, created=7)
        _APPS[key] = create_app(FakeEngine(tokenizer, info=info), config, validate_responses=True)
    app = _APPS[key]

    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            return await client.request(method, path, **kw)

    return asyncio.run(run())


def test_models_list_adds_every_servable_cached_model(tokenizer, hub) -> None:
    r = call(tokenizer, "GET", "/v1/models")
    assert r.status_code == 200
    rows = r.json()["data"]
    assert rows[0]["id"] == "org/served"
    served = rows[0]
    for key in ("reasoning", "vision", "audio", "batch_mode", "tools", "structured_output"):
        assert key in served
    assert served["capabilities"]["anthropic_messages"] is True
    assert served["batch_mode"] in ("batch", "serial")
    library = [r for r in rows[1:] if "tier" in r]
    assert [(r["id"], r["vision"], r["tier"]) for r in library] == [
        ("org/other", False, "targeted"),
        ("org/vlm", True, "targeted"),
    ]  # the served repo once, the unsupported architecture never
    assert all(r["object"] == "model" and r["created"] == 7 for r in library)


def test_retrieve_stays_on_served_models(tokenizer, hub) -> None:
    assert call(tokenizer, "GET", "/v1/models/org/served").json()["id"] == "org/served"
    assert call(tokenizer, "GET", "/v1/models/org/other").status_code == 404


def test_library_rows_and_refresh(tokenizer, hub) -> None:
    r = call(tokenizer, "GET", "/library?refresh=1")
    assert r.status_code == 200
    rows = {m["repo_id"]: m for m in r.json()["models"]}
    assert set(rows) == {"org/served", "org/other", "org/vlm", "org/alien"}
    assert rows["org/served"]["serving"] is True and rows["org/other"]["serving"] is False
    assert rows["org/alien"]["supported"] is False and rows["org/alien"]["support_tier"] is None
    assert rows["org/other"]["assessment"]["max_safe_context"] == 2048  # the window
    assert rows["org/served"]["assessment"] is None  # no weights on disk
    local = call(tokenizer, "GET", "/api/hub/local").json()
    assert local["ok"] is True and len(local["models"]) == 4


def test_gc_execute_needs_yes_and_deletes_nothing_without(tokenizer, hub) -> None:
    add_revision(hub, "org/other", commit_hash(9), {"config.json": b"older"})
    before = sorted(hub.rglob("*"))
    plan = call(tokenizer, "GET", "/api/gc/plan").json()
    assert plan["superseded"][0]["repo_id"] == "org/other"
    assert plan["superseded"][0]["prune_snapshots"] == 1
    for body in ({}, {"yes": False}, {"yes": "true"}):
        r = call(tokenizer, "POST", "/api/gc/execute", json=body)
        assert r.status_code == 400, body
        assert r.json().get("ok") is False or r.json()["error"]["param"] == "yes"
    assert sorted(hub.rglob("*")) == before
    done = call(tokenizer, "POST", "/api/gc/execute", json={"yes": True}).json()
    assert done == {"ok": True, "snapshots": 1, "blobs": 1, "reclaimed_bytes": 5}
    assert not (hub / "models--org--other" / "snapshots" / commit_hash(9)).exists()


@pytest.mark.parametrize(
    "body",
    [
        {"folder_name": "../../etc"},
        {"rel_path": "/etc"},
        {"rel_path": "models--org--served/../../x"},
    ],
)
def test_resolve_folder_refuses_escapes(tokenizer, hub, body) -> None:
    r = call(tokenizer, "POST", "/api/model/resolve-folder", json=body)
    assert r.status_code == 400 and r.json()["ok"] is False


def test_resolve_folder_finds_a_hub_folder(tokenizer, hub) -> None:
    r = call(
        tokenizer, "POST", "/api/model/resolve-folder", json={"folder_name": "models--org--vlm"}
    )
    assert r.json() == {
        "ok": True,
        "path": str(hub / "models--org--vlm" / "snapshots" / commit_hash(3)),
        "repo_id": "org/vlm",
        "model_type": "qwen2_vl",
    }
    missing = call(tokenizer, "POST", "/api/model/resolve-folder", json={"folder_name": "nope"})
    assert missing.status_code == 200 and missing.json()["ok"] is False


def test_download_refuses_repo_ids_that_escape(tokenizer, hub) -> None:
    for repo in ("../etc/passwd", "/abs/path", "org/..", "a/b/c"):
        r = call(tokenizer, "POST", "/api/hub/download", json={"repo": repo})
        assert r.status_code == 400 and r.json()["ok"] is False, repo
    assert not any(p.name.startswith("models--") and ".." in p.name for p in hub.iterdir())


def test_serve_answers_restart_required_with_the_command(tokenizer, hub) -> None:
    r = call(tokenizer, "POST", "/api/hub/serve", json={"model": "org/other"})
    assert r.json() == {"ok": False, "restart_required": True, "command": "mlxspec serve org/other"}
    bad = call(tokenizer, "POST", "/api/hub/serve", json={"model": "../x"})
    assert bad.status_code == 400
    absent = call(tokenizer, "POST", "/api/hub/serve", json={"model": "org/absent"})
    assert absent.status_code == 404 and "download it first" in absent.json()["error"]
    alien = call(tokenizer, "POST", "/api/hub/serve", json={"model": "org/alien"})
    assert alien.status_code == 404  # on disk, but no module for its architecture


def test_foreign_origin_and_missing_key_are_refused(tokenizer, hub) -> None:
    evil = {"Origin": "https://evil.example"}
    for method, path in (("GET", "/library"), ("GET", "/api/gc/plan"), ("POST", "/api/gc/execute")):
        r = call(tokenizer, method, path, headers=evil, json={"yes": True})
        assert r.status_code == 403, path
        assert "model library" in r.json()["error"]["message"]
    assert (
        call(tokenizer, "GET", "/library", headers={"Origin": "http://localhost:8080"}).status_code
        == 200
    )
    keyed = dataclasses.replace(ServeConfig(), api_key="k")
    assert call(tokenizer, "GET", "/library", keyed).status_code == 401
    ok = call(tokenizer, "GET", "/library", keyed, headers={"Authorization": "Bearer k"})
    assert ok.status_code == 200
    assert sorted(hub.rglob("*"))  # nothing deleted by the refused execute
    assert (hub / "models--org--other").is_dir()


def test_search_is_offline_not_a_500_when_the_hub_is_down(tokenizer, hub, monkeypatch) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: refused
    r = call(tokenizer, "GET", "/api/hub/search?q=qwen")
    assert r.status_code == 200
    body = r.json()
    assert body["ok"] is True and body["offline"] is True and body["results"] == []
    assert body["error"]
    assert call(tokenizer, "GET", "/api/hub/search").status_code == 400


def test_downloads_lists_a_failed_download_with_its_error(tokenizer, hub) -> None:
    r = call(tokenizer, "GET", "/downloads")
    assert r.json() == {"downloads": []}
    json.dumps(r.json())


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/api/model/resolve-folder", {"folder_name": "x" * 300}, 200),
        ("POST", "/api/model/resolve-folder", {"rel_path": "a/" + "y" * 900}, 200),
        ("POST", "/api/model/resolve-folder", {"folder_name": "0" * 40 + "/[*?"}, 200),
        ("POST", "/api/model/resolve-folder", {"folder_name": "a\x00b"}, 400),
        ("POST", "/api/model/resolve-folder", {}, 400),
        ("POST", "/api/hub/download", {"repo": "ørg/nåme"}, 400),
        ("POST", "/api/hub/download", {"repo": "org/" + "n" * 150}, 400),
        ("POST", "/api/hub/serve", {"model": "\u202e/x"}, 400),
    ],
)
def test_odd_inputs_are_4xx_or_answers_never_500(tokenizer, hub, method, path, body, status):
    r = call(tokenizer, method, path, json=body)
    assert r.status_code == status, r.text

"""``POST /api/hub/serve`` under ``--isolate``: the parent swaps its pool's
default (no child is started here: the new default starts with its first request)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

import httpx

from mlxspec.config import ServeConfig
from mlxspec.supervisor.parent import ParentApp
from mlxspec.supervisor.pool import Pool


def requests(tmp_path: Path, calls: list[tuple[str, str, Any]], key: str | None = None) -> list:
    config = dataclasses.replace(
        ServeConfig(), model="org/first", model_pool=("org/second",), isolate=True, api_key=key
    )
    pool = Pool(config, tmp_path)
    app = ParentApp(config, pool)

    async def run() -> list:
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://localhost", headers=headers
        ) as client:
            return [await client.request(m, p, json=b) for m, p, b in calls]

    return [*asyncio.run(run()), pool]


def test_serve_swaps_the_pool_default_without_a_restart(tmp_path: Path, monkeypatch) -> None:
    from tests.library_cache import add_revision, commit_hash, tiny_config

    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "own"))
    add_revision(hub, "org/third", commit_hash(3), {"config.json": tiny_config()}, ("main",))
    *answers, pool = requests(
        tmp_path,
        [
            ("POST", "/api/hub/serve", {"model": "org/second"}),
            ("GET", "/engine", None),
            ("POST", "/api/hub/serve", {"model": "org/third"}),
            ("GET", "/engine", None),
            ("POST", "/api/hub/serve", {"model": "org/not-downloaded"}),
        ],
    )
    assert answers[4].status_code == 404 and "download it first" in answers[4].text
    assert answers[0].json() == {"ok": True, "model": "org/second", "default": "org/second"}
    assert answers[1].json()["pool"]["default"] == "org/second"
    assert answers[2].json()["default"] == "org/third"
    assert answers[3].json()["pool"]["models"] == ["org/first", "org/second", "org/third"]
    assert pool.default == "org/third" and pool.resident() == []  # nothing was started


def test_serve_refuses_paths_and_needs_the_key(tmp_path: Path) -> None:
    *answers, pool = requests(
        tmp_path,
        [
            ("POST", "/api/hub/serve", {"model": "../../etc"}),
            ("POST", "/api/hub/serve", {"model": "/abs/folder"}),
            ("POST", "/api/hub/serve", {}),
        ],
        key="k",
    )
    assert [a.status_code for a in answers] == [400, 400, 400]
    assert pool.default == "org/first" and list(pool.children) == ["org/first", "org/second"]

    async def unkeyed() -> int:
        config = dataclasses.replace(ServeConfig(), model="org/first", isolate=True, api_key="k")
        app = ParentApp(config, Pool(config, tmp_path / "b"))
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
            r = await client.post("/api/hub/serve", json={"model": "org/x"})
            return r.status_code

    (tmp_path / "b").mkdir()
    assert asyncio.run(unkeyed()) == 401


def test_pool_models_list_adds_the_library(tmp_path: Path, monkeypatch) -> None:
    from tests.library_cache import add_revision, commit_hash, tiny_config

    hub = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "own"))
    for n, repo in enumerate(("org/second", "org/lib")):
        add_revision(hub, repo, commit_hash(n), {"config.json": tiny_config()}, ("main",))
    answer = requests(tmp_path, [("GET", "/v1/models", None)])[0]
    rows = answer.json()["data"]
    assert [r["id"] for r in rows] == ["org/first", "org/second", "org/lib"]
    assert rows[2]["tier"] == "targeted" and "resident" not in rows[2]

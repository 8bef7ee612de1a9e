"""The adapters' limits (issue 25, item 6) on the tiny random model: ``--max-adapters``
(429 ``too_many_adapters``), ``--max-adapter-stack`` (400 ``adapter_stack_too_deep``
on every surface), one mount per set of weights (409 ``adapter_already_mounted``),
and ``GET /v1/adapters/available`` listing the ``--adapter-dirs`` folders. Before,
200 mounts of one folder took 300 MB, a 200-adapter stack ran, and the listing
ignored ``--adapter-dirs``."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fixtures.random_adapters import make_random_adapter
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine import AdapterLimits
from tests.conftest import LiveServer

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three random adapters (``a``, ``b``, ``c``) and ``a-copy``, a byte copy of ``a``."""
    root = tmp_path_factory.mktemp("limits")
    for seed, name in enumerate("abc", start=1):
        make_random_adapter(tiny_model_dir, root / name, seed=seed, num_layers=1)
    shutil.copytree(root / "a", root / "a-copy")
    return root


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[object]:
    """An engine of this module's own, allowing 2 mounted adapters and stacks of 2."""
    from mlxspec.engine import Engine

    engine = Engine.load(tiny_model_dir, "tiny-llama")
    engine.adapters.limits = AdapterLimits(max_mounted=2, max_stack=2)
    engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine: object, adapter_dirs: Path) -> Iterator[LiveServer]:
    from mlxspec.config import ServeConfig
    from mlxspec.http.app import create_app

    config = ServeConfig(adapter_dirs=(str(adapter_dirs),))
    with LiveServer(create_app(engine, config, validate_responses=True), config) as live:
        yield live


@pytest.fixture()
def http(server: LiveServer, engine: object) -> Iterator[httpx.Client]:
    with checking_client(server.base, timeout=60) as c:
        yield c
    for adapter_id in engine.adapters.ids():  # type: ignore[attr-defined]
        asyncio.run(engine.run_exclusive(lambda i=adapter_id: engine.adapters.unmount(i)))  # type: ignore[attr-defined]


def mount(http: httpx.Client, adapter_id: str, path: Path) -> httpx.Response:
    return http.post("/v1/adapters", json={"id": adapter_id, "path": str(path)})


def test_a_mount_past_max_adapters_is_429_naming_the_flag(
    http: httpx.Client, adapter_dirs: Path
) -> None:
    assert mount(http, "a", adapter_dirs / "a").status_code == 200
    assert mount(http, "b", adapter_dirs / "b").status_code == 200
    r = mount(http, "c", adapter_dirs / "c")
    assert r.status_code == 429
    error = r.json()["error"]
    assert error["code"] == "too_many_adapters" and error["type"] == "resource_admission"
    assert error["message"] == (
        "2 adapters are mounted, the most allowed (--max-adapters 2): unmount one first"
    )
    assert [row["id"] for row in http.get("/v1/adapters").json()["adapters"]] == ["a", "b"]
    # replacing a mounted id adds none: allowed at the cap
    assert mount(http, "b", adapter_dirs / "c").status_code == 200
    assert http.delete("/v1/adapters/a").status_code == 200
    assert mount(http, "a", adapter_dirs / "a").status_code == 200


def test_the_same_weights_under_a_second_id_are_409(http: httpx.Client, adapter_dirs: Path) -> None:
    assert mount(http, "a", adapter_dirs / "a").status_code == 200
    for path in (adapter_dirs / "a", adapter_dirs / "a-copy"):  # the folder, or a copy of it
        r = mount(http, "twin", path)
        assert r.status_code == 409
        error = r.json()["error"]
        assert error["code"] == "adapter_already_mounted" and error["param"] == "path"
        assert "same weights as the mounted adapter 'a'" in error["message"]
    assert [row["id"] for row in http.get("/v1/adapters").json()["adapters"]] == ["a"]
    assert mount(http, "a", adapter_dirs / "a-copy").status_code == 200  # a reload of its id


@pytest.mark.parametrize("surface", ["chat", "completions", "messages"])
def test_a_stack_past_max_adapter_stack_is_400_naming_the_flag(
    http: httpx.Client, adapter_dirs: Path, surface: str
) -> None:
    assert mount(http, "a", adapter_dirs / "a").status_code == 200
    assert mount(http, "b", adapter_dirs / "b").status_code == 200
    paths = {
        "chat": ("/v1/chat/completions", CHAT),
        "completions": ("/v1/completions", {"prompt": "hello", "max_tokens": 2}),
        "messages": ("/v1/messages", {**CHAT, "model": "m"}),
    }
    path, body = paths[surface]
    assert http.post(path, json={**body, "adapter": "a+b"}).status_code == 200
    r = http.post(path, json={**body, "adapter": "a+b+a"})
    assert r.status_code == 400
    error = r.json()["error"]
    message = "adapter spec stacks 3 adapters; at most 2 may be stacked (--max-adapter-stack)"
    assert error["message"] == message
    if surface == "messages":  # Anthropic's envelope
        assert r.json()["type"] == "error" and error["type"] == "invalid_request_error"
    else:
        assert error["code"] == "adapter_stack_too_deep" and error["param"] == "adapter"


def test_a_huge_stack_is_refused_at_once(http: httpx.Client) -> None:
    """200 unknown ids (the break-it run's stack) and a million: the limit, quickly."""
    for count in (200, 1_000_000):
        spec = "+".join(f"x{i}" for i in range(count))
        started = time.monotonic()
        r = http.post("/v1/chat/completions", json={**CHAT, "adapter": spec})
        assert r.status_code == 400 and r.json()["error"]["code"] == "adapter_stack_too_deep"
        assert f"stacks {count} adapters" in r.json()["error"]["message"]
        assert time.monotonic() - started < 10


def test_available_lists_the_adapter_dirs_folders(
    http: httpx.Client, adapter_dirs: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))  # an empty cache folder
    monkeypatch.delenv("MLXSPEC_ADAPTER_DIRS", raising=False)
    assert mount(http, "b", adapter_dirs / "b").status_code == 200
    rows = http.get("/v1/adapters/available").json()["adapters"]
    assert [row["id"] for row in rows] == ["a", "a-copy", "b", "c"]
    b = next(row for row in rows if row["id"] == "b")
    assert b == {
        "id": "b",
        "path": str((adapter_dirs / "b").resolve()),
        "rank": 4,
        "scale": 8.0,
        "base_model": b["base_model"],
        "mounted": True,
        "compatible": True,
    }
    assert [row["mounted"] for row in rows] == [False, False, True, False]


def test_serve_sets_the_limits_from_its_flags(tiny_model_dir: Path) -> None:
    from mlxspec.cli.flags import parse_config
    from mlxspec.cli.main import load_engine

    config = parse_config(
        ["serve", str(tiny_model_dir), "--max-adapters", "3", "--max-adapter-stack", "1"]
    )
    engine = load_engine(config)
    try:
        assert engine.adapters.limits == AdapterLimits(max_mounted=3, max_stack=1)
    finally:
        engine.close()

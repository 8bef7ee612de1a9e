"""Downloads from a local fake hub (``tests/fake_hub.py``, ``HF_ENDPOINT`` at it):
progress at ``/downloads``, only the files a model needs, a duplicate 409, the
model then listed and loadable, an interrupted download resumed, the offline
state, search filtered to MLX."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxspec.engine import ModelInfo
from mlxspec.http.app import create_app
from mlxspec.library import Downloads
from mlxspec.library.hub import search
from tests.conftest import LiveServer
from tests.fake_hub import FakeHub
from tests.fakes import FakeEngine

REPO = "mlx-community/tiny-llama"


@pytest.fixture
def fake_hub(
    tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[FakeHub]:
    import huggingface_hub.constants

    hub = FakeHub()
    files = {p.name: p.read_bytes() for p in tiny_model_dir.iterdir() if p.is_file()}
    files["README.md"] = b"# not a file a model needs"
    files["pytorch_model.bin"] = b"\0" * 1000
    hub.add(REPO, files)
    hub.add("someone/tiny-llama-torch", {"config.json": b"{}"}, tags=("pytorch",))
    with LiveServer(hub.app()) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.base)
        monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
        monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "mlxspec"))
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
        # huggingface_hub reads 10 MB at a time; the tiny weights are 360 KB
        monkeypatch.setattr(huggingface_hub.constants, "DOWNLOAD_CHUNK_SIZE", 16 * 1024)
        yield hub


def _client_calls(app: Any, calls: list[tuple[str, str, Any]]) -> list[httpx.Response]:
    async def run() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            return [await c.request(m, p, json=b) for m, p, b in calls]

    return asyncio.run(run())


def test_download_progress_then_listed_and_loadable(
    fake_hub: FakeHub, tokenizer: object, tiny_model_dir: Path
) -> None:
    fake_hub.delay = 0.05  # 23 chunks of the weights: about a second to watch
    info = ModelInfo(id="served", context_window=256, created=1)
    app = create_app(FakeEngine(tokenizer, info=info))
    start, again = _client_calls(
        app,
        [
            ("POST", "/api/hub/download", {"repo": REPO}),
            ("POST", "/api/hub/download", {"repo": REPO}),
        ],
    )
    assert start.json() == {"ok": True, "repo": REPO, "started": True}
    assert again.status_code == 409
    assert again.json() == {"ok": False, "error": f"a download for {REPO} is already in progress"}
    seen, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline:
        (row,) = _client_calls(app, [("GET", "/downloads", None)])[0].json()["downloads"]
        if row["state"] != "active":
            break
        seen.append(row["received_bytes"])
        time.sleep(0.1)
    assert row["state"] == "done", row
    weights = (tiny_model_dir / "model.safetensors").stat().st_size
    needed = [p for p in tiny_model_dir.iterdir() if p.is_file()]
    assert row["files_total"] == row["files_done"] == len(needed)
    assert row["total_bytes"] == row["received_bytes"] == sum(p.stat().st_size for p in needed)
    assert row["finished_at"] >= row["started_at"] and row["current_file"] is None
    inside = sorted({b for b in seen if 0 < b < row["total_bytes"]})
    assert len(inside) >= 2 and inside[0] < weights, seen  # progress moved while active
    assert "README.md" not in fake_hub.gets and "pytorch_model.bin" not in fake_hub.gets
    models, library = _client_calls(app, [("GET", "/v1/models", None), ("GET", "/library", None)])
    assert REPO in [m["id"] for m in models.json()["data"]]
    (lib_row,) = [m for m in library.json()["models"] if m["repo_id"] == REPO]
    assert lib_row["supported"] and lib_row["assessment"]["fits"]
    # Served: the loader resolves the repo id from the cache, and mlx-lm loads it.
    from mlx_lm import load

    from mlxspec.engine.model.loader import resolve_model

    resolved = resolve_model(REPO)
    assert resolved.source == "hf-cache" and resolved.model_id == REPO
    assert (resolved.path / "model.safetensors").read_bytes() == (
        tiny_model_dir / "model.safetensors"
    ).read_bytes()
    model, _ = load(str(resolved.path))
    assert model.args.num_hidden_layers >= 1


def test_an_interrupted_download_resumes(fake_hub: FakeHub, tiny_model_dir: Path) -> None:
    fake_hub.cut = {"model.safetensors"}
    downloads = Downloads()
    first = downloads.run(REPO)
    if first.state == "error":  # huggingface_hub gave up: the next download resumes
        assert downloads.listing()[0]["error"]
        first = downloads.run(REPO)
    assert first.state == "done", first.error
    resumed = [r for r in fake_hub.ranges if r.startswith("model.safetensors bytes=")]
    assert resumed and int(resumed[-1].split("=")[1].split("-")[0]) > 0, fake_hub.ranges
    assert (Path(first.path or "") / "model.safetensors").read_bytes() == (
        tiny_model_dir / "model.safetensors"
    ).read_bytes()


def test_offline_hub_is_an_error_row_and_an_offline_search(
    fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert [r["id"] for r in search("tiny")["results"]] == [REPO]  # MLX only
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    downloads = Downloads()
    failed = downloads.run(REPO)
    assert failed.state == "error" and failed.error
    (row,) = downloads.listing()
    assert row["state"] == "error" and row["error"] == failed.error and row["finished_at"]
    offline = search("tiny")
    assert offline["offline"] is True and offline["results"] == []


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> object:
    from mlx_lm.tokenizer_utils import load

    return load(tiny_model_dir)


def test_cli_download_then_ls(fake_hub: FakeHub, capsys: pytest.CaptureFixture) -> None:
    from mlxspec.cli.main import main

    fake_hub.delay = 0.05  # slow enough for a progress line
    assert main(["download", REPO, "--include", "README.md"]) == 0
    out = capsys.readouterr().out
    assert "model.safetensors" in out and f"{REPO}: 5 files" in out
    assert "README.md" in fake_hub.gets and "pytorch_model.bin" not in fake_hub.gets
    assert main(["ls"]) == 0
    assert REPO in capsys.readouterr().out
    assert main(["download", "../../etc"]) == 2

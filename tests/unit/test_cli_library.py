"""``mlxspec ls``, ``rm``, ``gc``, ``fit`` in process over a hub cache in tmp_path."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from mlxspec.cli.library_cmds import run
from mlxspec.cli.main import main
from tests.library_cache import add_revision, commit_hash, tiny_config


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(root))
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "own"))
    files = {
        "config.json": tiny_config(quantization={"bits": 4, "group_size": 64}),
        "model.safetensors": b"\0" * 2048,
    }
    add_revision(root, "org/tiny", commit_hash(1), files, ("main",))
    add_revision(root, "org/tiny", commit_hash(2), {"config.json": b"{}"})
    add_revision(root, "org/odd", commit_hash(3), {"config.json": tiny_config("nosuch")}, ("main",))
    return root


def out_of(argv: list[str]) -> tuple[int, str]:
    buffer = io.StringIO()
    return run(argv, buffer), buffer.getvalue()


def test_ls_table_and_json(hub: Path) -> None:
    code, text = out_of(["ls"])
    lines = text.splitlines()
    assert code == 0 and lines[0].split()[:5] == ["REPO", "TYPE", "SIZE", "QUANT", "FITS"]
    tiny = next(line.split() for line in lines if line.startswith("org/tiny"))
    assert tiny[1:6] == ["llama", "2.3", "KB", "4-bit/64", "yes"]
    odd = next(line.split() for line in lines if line.startswith("org/odd"))
    assert odd[-2:] == ["no", "-"]  # unsupported, not serving
    code, text = out_of(["ls", "--json"])
    assert {m["repo_id"] for m in json.loads(text)["models"]} == {"org/tiny", "org/odd"}


def test_gc_prints_the_plan_and_deletes_only_with_yes(hub: Path) -> None:
    old = hub / "models--org--tiny" / "snapshots" / commit_hash(2)
    code, text = out_of(["gc"])
    assert code == 0 and "org/tiny" in text and "nothing deleted" in text and old.is_dir()
    code, text = out_of(["gc", "--yes"])
    assert code == 0 and "deleted 1 snapshots and 1 blobs" in text
    assert not old.exists() and (hub / "models--org--tiny" / "snapshots" / commit_hash(1)).is_dir()
    assert out_of(["gc"])[1].startswith("nothing to reclaim")


def test_rm_removes_one_repo_and_refuses_paths(hub: Path, capsys: pytest.CaptureFixture) -> None:
    assert out_of(["rm", "org/odd"])[0] == 0
    assert not (hub / "models--org--odd").exists() and (hub / "models--org--tiny").is_dir()
    assert out_of(["rm", "org/odd"])[0] == 1
    assert out_of(["rm", "../models--org--tiny"])[0] == 1
    assert "invalid repo id" in capsys.readouterr().err
    assert (hub / "models--org--tiny").is_dir()


def test_fit_table_json_and_exit_codes(hub: Path, tmp_path: Path) -> None:
    code, text = out_of(["fit", "org/tiny", "--json"])
    body = json.loads(text)
    assert code == 0 and body["fits"] is True and body["max_safe_context"] == 2048
    assert body["kv_bytes_per_token"] == 2 * 2 * 16 * 2 * 2 and body["weights_bytes"] == 2048
    assert out_of(["fit", "org/tiny", "--context", "100000"])[0] == 3  # past the window
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / "config.json").write_bytes(tiny_config())
    (folder / "model.safetensors").write_bytes(b"\0" * 10)
    code, text = out_of(["fit", str(folder)])
    assert code == 0 and "max_safe_context" in text
    assert out_of(["fit", "org/missing"])[0] == 1


def test_main_dispatches_library_commands(hub: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["ls"]) == 0
    assert "org/tiny" in capsys.readouterr().out

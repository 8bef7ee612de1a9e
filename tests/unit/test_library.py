"""The model library room: cache scan, support tiers, fit assessment, GC, paths."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from mlxspec.library import (
    Machine,
    PathRefused,
    Registry,
    assess,
    check_repo_id,
    execute_gc,
    plan_gc,
    resolve_folder,
    scan,
)
from mlxspec.library.gc import remove_repo
from mlxspec.library.support import support_tier
from tests.library_cache import add_revision, commit_hash, tiny_config

MACHINE = Machine(usable_bytes=1 << 30, bandwidth_gbs=10.0)


@pytest.fixture
def caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    hub, own = tmp_path / "hub", tmp_path / "mlxspec"
    hub.mkdir()
    own.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(own))
    return hub, own


def test_scan_reads_config_quant_and_index_without_tensor_bytes(caches) -> None:
    hub, _ = caches
    quant = {"quantization": {"bits": 4, "group_size": 64}}
    index = {"metadata": {"total_size": 123_456}, "weight_map": {}}
    add_revision(
        hub,
        "org/tiny-4bit",
        commit_hash(1),
        {
            "config.json": tiny_config(**quant),
            "model.safetensors.index.json": json.dumps(index).encode(),
            "model-00001-of-00001.safetensors": b"\0" * 1000,
        },
        refs=("main",),
    )
    add_revision(hub, "org/unknown-arch", commit_hash(2), {"config.json": tiny_config("nosuch")})
    rows = {r.repo_id: r for r in scan()}
    tiny = rows["org/tiny-4bit"]
    assert (tiny.model_type, tiny.quant_bits, tiny.quant_group_size) == ("llama", 4, 64)
    assert tiny.weights_bytes == 123_456  # the index's total, not the file's 1000 bytes
    assert tiny.size_bytes == 1000 + len(tiny_config(**quant)) + len(json.dumps(index))
    assert (tiny.supported, tiny.support_tier, tiny.source) == (True, "targeted", "hf-cache")
    unknown = rows["org/unknown-arch"]
    assert (unknown.supported, unknown.support_tier) == (False, None)


def test_support_tier_follows_mlx_lm_and_mlx_vlm() -> None:
    assert support_tier({"model_type": "qwen3"}) == "targeted"
    assert support_tier({"model_type": "mistral"}) == "targeted"  # MODEL_REMAPPING -> llama
    assert support_tier({"model_type": "qwen2_vl", "vision_config": {}}) == "targeted"
    assert support_tier({"model_type": "not_a_model"}) is None
    assert support_tier({"model_type": "../os"}) is None
    assert support_tier({}) is None


def test_one_row_per_repo_main_revision_wins(caches) -> None:
    hub, _ = caches
    add_revision(hub, "org/m", commit_hash(1), {"config.json": tiny_config("qwen3")})
    time.sleep(0.01)
    add_revision(hub, "org/m", commit_hash(2), {"config.json": tiny_config("llama")})
    (hub / "models--org--m" / "refs").mkdir()
    (hub / "models--org--m" / "refs" / "main").write_text(commit_hash(1))
    rows = [r for r in scan() if r.repo_id == "org/m"]
    assert len(rows) == 1
    assert (rows[0].model_type, rows[0].revisions) == ("qwen3", 2)
    assert rows[0].path.endswith(commit_hash(1))


def test_own_caches_gguf_whisper_adapters(caches) -> None:
    _, own = caches
    gguf = own / "gguf" / "abc-v1"
    gguf.mkdir(parents=True)
    (gguf / "config.json").write_bytes(tiny_config())
    (gguf / "mlxspec-gguf.json").write_text(json.dumps({"gguf": "/x/My-Model.Q4_K_M.gguf"}))
    (gguf / "model.safetensors").write_bytes(b"\0" * 64)
    half = own / "gguf" / "def-v1"  # a conversion in progress: no marker yet
    half.mkdir()
    (half / "config.json").write_bytes(tiny_config())
    whisper = own / "whisper" / "w1-v1"
    whisper.mkdir(parents=True)
    (whisper / "config.json").write_text('{"model_type": "whisper"}')
    (whisper / "mlxspec-whisper.json").write_text("{}")
    adapter = own / "adapters" / "my-lora"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text("{}")
    rows = {r.repo_id: r for r in scan()}
    assert set(rows) == {"My-Model", "whisper/w1-v1", "adapter/my-lora"}
    assert rows["My-Model"].source == "gguf" and rows["My-Model"].weights_bytes == 64
    assert rows["My-Model"].chat
    assert rows["whisper/w1-v1"].audio and not rows["whisper/w1-v1"].chat
    assert not rows["adapter/my-lora"].chat


def test_assessment_uses_the_fit_model(caches) -> None:
    hub, _ = caches
    add_revision(hub, "org/m", commit_hash(1), {"config.json": tiny_config()}, refs=("main",))
    (row,) = [r for r in scan() if r.repo_id == "org/m"]
    row = type(row)(**{**row.__dict__, "weights_bytes": 100_000_000})
    # kv per token: 2 layers x 2 kv heads x 16 head dim x 2 (K, V) x 2 bytes = 256
    roomy = assess(row, Machine(1 << 30, 10.0))
    assert roomy is not None and roomy.fits and roomy.max_safe_context == 2048  # the window
    assert roomy.predicted_decode_tps == round(10e9 / (100_000_000 + 256 * 2048), 2)
    # usable U leaves 0.9 U - weights for the KV cache (10% transient reserve)
    tight = assess(row, Machine((100_000_000 + 256 * 1000) * 10 // 9 + 1, 10.0))
    assert tight is not None and tight.max_safe_context == 1000 and tight.fits
    none = assess(row, Machine(50_000_000, 10.0))
    assert none is not None and (none.fits, none.max_safe_context, none.predicted_decode_tps) == (
        False,
        0,
        0.0,
    )
    assert assess(row, Machine(1 << 30, 10.0), context=4096).fits is False  # past the window


def test_registry_caches_for_its_ttl_and_refresh_rescans(caches) -> None:
    hub, _ = caches
    registry = Registry(machine=lambda: MACHINE)
    assert registry.library() == []
    add_revision(hub, "org/new", commit_hash(1), {"config.json": tiny_config()})
    assert registry.library() == []  # cached
    rows = registry.library(serving={"org/new"}, refresh=True)
    assert [(r["repo_id"], r["serving"]) for r in rows] == [("org/new", True)]
    assert set(rows[0]) >= {"quant_group_size", "support_tier", "assessment", "size_bytes"}


def _gc_cache(hub: Path) -> dict[str, Path]:
    """org/m: revision 1 superseded by 2 (shared tokenizer blob), revision 3
    unreferenced with a file no kept revision has (skipped); org/solo: one
    revision without refs (kept)."""
    shared = b"tokenizer" * 10
    add_revision(hub, "org/m", commit_hash(1), {"config.json": b"old", "tok.json": shared})
    add_revision(
        hub, "org/m", commit_hash(2), {"config.json": b"new", "tok.json": shared}, refs=("main",)
    )
    add_revision(hub, "org/m", commit_hash(3), {"config.json": b"odd", "extra.bin": b"x" * 7})
    add_revision(hub, "org/solo", commit_hash(4), {"config.json": b"solo"})
    blobs = hub / "models--org--m" / "blobs"
    import hashlib

    return {
        n: blobs / hashlib.sha256(c).hexdigest() for n, c in (("old", b"old"), ("shared", shared))
    }


def test_gc_plan_names_exactly_what_execute_deletes(caches) -> None:
    hub, _ = caches
    blobs = _gc_cache(hub)
    before = {p for p in hub.rglob("*")}
    plan = plan_gc()
    assert plan.json() == {
        "ok": True,
        "superseded": [
            {
                "repo_id": "org/m",
                "prune_snapshots": 1,
                "skipped_snapshots": 1,
                "dead_blobs": 1,
                "reclaim_bytes": 3,
            }
        ],
        "reclaim_bytes": 3,
    }
    assert {p.name for p in plan.paths()} == {blobs["old"].name, commit_hash(1)}
    assert {p for p in hub.rglob("*")} == before  # planning deletes nothing
    result = execute_gc()
    assert result == {"ok": True, "snapshots": 1, "blobs": 1, "reclaimed_bytes": 3}
    gone = before - {p for p in hub.rglob("*")}
    assert {p for p in gone if p.parent.name in ("blobs", "snapshots")} == set(plan.paths())
    assert blobs["shared"].is_file()  # still linked by revision 2
    assert (hub / "models--org--m" / "snapshots" / commit_hash(3)).is_dir()  # skipped
    assert (hub / "models--org--solo" / "snapshots" / commit_hash(4)).is_dir()
    assert plan_gc().json()["reclaim_bytes"] == 0


def test_remove_repo_deletes_only_that_repo(caches) -> None:
    hub, _ = caches
    _gc_cache(hub)
    assert remove_repo("org/solo") == 4
    assert not (hub / "models--org--solo").exists() and (hub / "models--org--m").is_dir()
    with pytest.raises(FileNotFoundError):
        remove_repo("org/solo")
    with pytest.raises(PathRefused):
        remove_repo("../models--org--m")


@pytest.mark.parametrize(
    "bad", ["", "org", "/etc/passwd", "../x/y", "org/..", "org/a/b", "org--x/y", 3, None]
)
def test_repo_ids_that_escape_are_refused(bad) -> None:
    with pytest.raises(PathRefused):
        check_repo_id(bad)


def test_resolve_folder_inside_the_caches_only(caches, tmp_path: Path) -> None:
    hub, own = caches
    snap = add_revision(
        hub, "org/m", commit_hash(1), {"config.json": tiny_config()}, refs=("main",)
    )
    found = resolve_folder(folder_name="models--org--m")
    assert found == {"ok": True, "path": str(snap), "repo_id": "org/m", "model_type": "llama"}
    assert resolve_folder(folder_name=commit_hash(1))["path"] == str(snap)
    bare = own / "plain"
    bare.mkdir()
    (bare / "config.json").write_bytes(tiny_config("qwen3"))
    assert resolve_folder(rel_path="plain") == {
        "ok": True,
        "path": str(bare),
        "model_type": "qwen3",
    }
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "config.json").write_bytes(tiny_config())
    os.symlink(outside, own / "link")  # a link out of the cache is not followed
    assert resolve_folder(folder_name="link")["ok"] is False
    assert resolve_folder(folder_name="nothing-here")["ok"] is False
    for bad in (
        {"folder_name": "../outside"},
        {"rel_path": str(outside)},
        {"rel_path": "a/../../x"},
    ):
        with pytest.raises(PathRefused):
            resolve_folder(**bad)
    with pytest.raises(PathRefused):
        resolve_folder()

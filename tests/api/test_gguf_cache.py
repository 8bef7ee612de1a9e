"""Tests for mlxspec.engine.model.gguf_cache: GGUF conversions keyed by file content."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402

from mlxspec.engine.model.gguf import CONVERTER_VERSION, MARKER_FILE, GGUFError  # noqa: E402
from mlxspec.engine.model.gguf_cache import (
    content_digest,
    conversion_folder,
    convert_once,
    prune_older_conversions,
    remember_digest,
)
from mlxspec.engine.model.loader import gguf_cache_folder  # noqa: E402
from tests.api.test_gguf import save_float_gguf, tiny_metadata, tiny_weights  # noqa: E402


def tiny_gguf(path: Path, seed: int = 0) -> Path:
    """A valid tiny llama GGUF at ``path``; another ``seed`` gives other weights."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_float_gguf(path, tiny_weights(seed=seed), tiny_metadata(), mx.float32)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_same_content_at_two_paths_shares_a_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "cache"))
    one = tiny_gguf(tmp_path / "venv1" / "Model.Q4_1.gguf")
    two = tmp_path / "venv2" / "renamed.gguf"
    two.parent.mkdir()
    shutil.copyfile(one, two)
    folder = gguf_cache_folder(one)
    assert folder == tmp_path / "cache" / "gguf" / f"{sha256(one)[:24]}-v{CONVERTER_VERSION}"
    assert gguf_cache_folder(two) == folder
    other = tiny_gguf(tmp_path / "venv1" / "Other.gguf", seed=1)
    assert other.stat().st_size == one.stat().st_size  # same size, other bytes
    assert gguf_cache_folder(other) != folder


def test_digest_is_the_content_sha256_and_remembered(tmp_path: Path) -> None:
    root = tmp_path / "gguf"
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + bytes(range(256)) * 5000)
    assert content_digest(gguf, root) == sha256(gguf)
    assert not root.exists()  # nothing is written until a conversion succeeds
    remember_digest(gguf, root, "ab" * 32)
    # A remembered version is not read again: the memo answers.
    assert content_digest(gguf, root) == "ab" * 32
    gguf.write_bytes(gguf.read_bytes() + b"x")  # an edit moves size, mtime and ctime
    assert content_digest(gguf, root) == sha256(gguf)


def test_unreadable_file_is_a_one_line_gguf_error(tmp_path: Path) -> None:
    with pytest.raises(GGUFError) as err:
        content_digest(tmp_path, tmp_path / "gguf")  # a folder, not a file
    assert str(err.value) == f"cannot read GGUF file {tmp_path}: is a directory"


def test_convert_once_per_content(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="mlxspec.engine")
    root = tmp_path / "cache"
    one = tiny_gguf(tmp_path / "a" / "tiny.gguf")
    out = convert_once(one, root)
    assert out == conversion_folder(root, sha256(one))
    marker = json.loads((out / MARKER_FILE).read_text())
    assert marker == {
        "gguf": str(one.resolve()),
        "converter_version": CONVERTER_VERSION,
        "size": one.stat().st_size,
        "sha256": sha256(one),
    }
    two = tmp_path / "b" / "tiny.gguf"
    two.parent.mkdir()
    shutil.copyfile(one, two)
    caplog.clear()
    assert convert_once(two, root) == out
    assert [r.getMessage() for r in caplog.records] == [f"using GGUF conversion cached in {out}"]
    other = convert_once(tiny_gguf(tmp_path / "c" / "tiny.gguf", seed=2), root)
    assert other != out and (other / "config.json").is_file()
    assert sorted(p.name for p in root.iterdir()) == sorted([".digests", out.name, other.name])


def _older(root: Path, name: str, marker: dict | None) -> Path:
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"old")
    if marker is not None:
        (folder / MARKER_FILE).write_text(json.dumps(marker))
    return folder


def test_only_our_older_conversions_of_the_same_content_are_pruned(tmp_path: Path) -> None:
    root = tmp_path / "gguf"
    digest = "c0ffee" * 10 + "abcd"
    prefix = digest[:24]
    old = CONVERTER_VERSION - 1
    stale = _older(root, f"{prefix}-v{old}", {"sha256": digest, "converter_version": old})
    kept = [
        # a name we never write, and a marker that names other versions
        _older(root, f"{prefix}-vx", {"sha256": digest, "converter_version": old}),
        _older(root, f"{prefix}-v{old}.bak", {"sha256": digest, "converter_version": old}),
        # the current version, and an unknown newer one
        _older(root, f"{prefix}-v{CONVERTER_VERSION}", {"sha256": digest}),
        _older(root, f"{prefix}-v{CONVERTER_VERSION + 1}", {"sha256": digest}),
        # the old path-keyed format, a user's folder and a marker for other bytes
        _older(root, "SmolLM2-135M-Instruct.Q4_1-347501f83f53", {"converter_version": old}),
        _older(root, "my-notes", None),
    ]
    other_bytes = _older(root, f"{'1' * 24}-v{old}", {"sha256": "1" * 64, "converter_version": old})
    assert prune_older_conversions(root, digest) == [stale]
    assert not stale.exists()
    assert all((f / "model.safetensors").is_file() for f in [*kept, other_bytes])


def test_a_name_match_with_other_bytes_in_the_marker_is_kept(tmp_path: Path) -> None:
    root = tmp_path / "gguf"
    digest = "c0ffee" * 10 + "abcd"
    old = CONVERTER_VERSION - 1
    twin = digest[:24] + "0" * 40  # same folder name, other content
    folder = _older(root, f"{digest[:24]}-v{old}", {"sha256": twin, "converter_version": old})
    assert prune_older_conversions(root, digest) == []
    assert (folder / "model.safetensors").is_file()

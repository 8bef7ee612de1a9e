"""The prompt cache namespace carries a fingerprint of the weight files, so KV
caches kept on disk for other weights at the same path are never restored."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import mlx.core as mx

from mlxspec.engine import Engine, Finished, GenerationRequest, LogitsParams
from mlxspec.engine.caches.prompt_cache import CacheNamespace
from mlxspec.engine.caches.ssd_cache import read_snapshot_header
from mlxspec.engine.model.loader import weights_fingerprint
from tests.helpers import text_and_finish

#: Forbid EOS (token 2, ``<|im_end|>``) so every run generates its full budget.
NO_EOS = LogitsParams(logit_bias=((2, -1e9),))
PROMPT = "the quick brown fox jumps over the lazy dog " * 3


def run(engine: Engine, req: GenerationRequest) -> tuple[str, Finished]:
    return asyncio.run(text_and_finish(engine, req))


def weight_file(folder: Path) -> Path:
    (path,) = folder.glob("*.safetensors")
    return path


def perturb_weights(folder: Path) -> None:
    """Save the weights again with every tensor scaled (same names and shapes)."""
    path = weight_file(folder)
    tensors, metadata = mx.load(str(path), return_metadata=True)
    mx.save_safetensors(str(path), {k: v * 1.5 for k, v in tensors.items()}, metadata)


def overwrite_tail(path: Path) -> None:
    """Change the file's last 4 bytes (tensor data) in place, keeping its size
    and modification time."""
    before = path.stat()
    data = bytearray(path.read_bytes())
    data[-4:] = bytes(4) if data[-4:] != bytes(4) else b"\x00\x00\x00\x3f"
    path.write_bytes(bytes(data))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def test_fingerprint_is_stable_and_sees_every_kind_of_change(tiny_model_dir, tmp_path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    first = weights_fingerprint(folder)
    assert len(first) == 16 and int(first, 16) >= 0
    assert weights_fingerprint(folder) == first  # same files, same value

    overwrite_tail(weight_file(folder))  # new numbers, same size and time
    changed = weights_fingerprint(folder)
    assert changed != first

    path = weight_file(folder)
    stat = path.stat()
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # touched
    touched = weights_fingerprint(folder)
    assert touched not in (first, changed)

    config = folder / "config.json"
    config.write_text(config.read_text().replace("{", '{"note": 1, ', 1))
    assert weights_fingerprint(folder) not in (first, changed, touched)


def test_engine_namespace_holds_the_fingerprint(tiny_model_dir) -> None:
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=1)
    fingerprint = weights_fingerprint(tiny_model_dir)
    assert engine.info.weights == fingerprint
    assert engine.cache_namespace == CacheNamespace("tiny-llama", weights=fingerprint)


def test_ssd_entry_of_other_weights_is_not_restored(tiny_model_dir, tmp_path) -> None:
    folder, ssd_dir = tmp_path / "model", tmp_path / "ssd"
    shutil.copytree(tiny_model_dir, folder)
    first = Engine.load(folder, "tiny-llama", max_batch=1, ssd_cache=ssd_dir)
    first.start()
    req = GenerationRequest(tuple(first.text_prompt(PROMPT)), max_tokens=8, logits=NO_EOS)
    try:
        run(first, req)
        assert first.prompt_cache.flush(30)["entries"] == 1
    finally:
        first.close()
    (snapshot,) = ssd_dir.glob("*.safetensors")
    assert read_snapshot_header(snapshot)[0] == tuple(first.cache_namespace)

    perturb_weights(folder)  # new weights at the same path
    second = Engine.load(folder, "tiny-llama", max_batch=1, ssd_cache=ssd_dir)
    second.start()
    try:
        assert second.cache_namespace.weights != first.cache_namespace.weights
        assert second.prompt_cache.ssd.stats()["entries"] == 1  # on disk, not for these weights
        _, fin = run(second, req)
        _, again = run(second, req)  # a RAM hit on its own entry still works
    finally:
        second.close()
    assert fin.cached_tokens == 0
    assert second.prompt_cache.ssd.stats()["restores"] == 0
    assert again.cached_tokens == len(req.prompt) - 1

"""SSD snapshot integrity (issue 16): a damaged snapshot is a miss, never KV.

Tensor bytes are checked against the digest written with the snapshot before
a restore is used; unreadable files (bad header length, bad JSON, zero length,
truncated) are deleted at start-up without stopping it; temporary files are
deleted only when their writer's pid is dead.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine import Engine
from mlxspec.engine.caches.prompt_cache import CacheNamespace, PromptCache
from mlxspec.engine.caches.ssd_cache import SsdCache, read_snapshot_header
from tests.conftest import LiveServer

NS = tuple(CacheNamespace("tiny-llama"))
TEXT = "the quick brown fox jumps over the lazy dog " * 3
STEM = "0123456789abcdef0123456789abcdef"  # a snapshot-shaped name


def write_snapshot(engine: Engine, directory: Path, text: str = TEXT) -> tuple[Path, list]:
    """Prefill ``text``, keep it with an SSD tier in ``directory`` and flush:
    the snapshot file and the KV arrays it was written from."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    tokens = engine.text_prompt(text)
    kv = make_prompt_cache(engine.model)
    engine.model(mx.array([tokens]), cache=kv)
    cache = PromptCache(1 << 30, SsdCache(directory))
    cache.store(CacheNamespace("tiny-llama"), tokens, kv)
    assert cache.flush(30)["durable"] is True
    (path,) = directory.iterdir()
    return path, [c.state for c in kv]


def layout(raw: bytes) -> tuple[int, dict]:
    """Where the data section starts and the parsed safetensors header."""
    (length,) = struct.unpack("<Q", raw[:8])
    return 8 + length, json.loads(raw[8 : 8 + length])


def damage(raw: bytes, how: str) -> bytes:
    """``raw`` with one kind of damage, asserted to change it."""
    out = bytearray(raw)
    start, header = layout(raw)
    if how == "flipped byte mid-data":
        out[start + (len(raw) - start) // 2] ^= 0x40
    elif how == "zeroed block":
        out[start + 100 : start + 612] = bytes(512)
    elif how == "last tensor":
        tensors = [v for k, v in header.items() if k != "__metadata__"]
        begin, end = max(tensors, key=lambda t: t["data_offsets"][1])["data_offsets"]
        assert end == len(raw) - start and end - begin > 16
        out[start + end - 3] ^= 0x01  # a low bit of its last element
    elif how == "token id in the header":
        tail = raw.index(b']"', raw.index(b"mlxspec_tokens"))  # the last token's last digit
        out[tail - 1] = ord(str((int(chr(raw[tail - 1])) + 1) % 10))
    elif how == "truncated while serving":
        del out[len(raw) - 40 :]
    assert bytes(out) != raw
    return bytes(out)


@pytest.mark.parametrize(
    "how",
    [
        "flipped byte mid-data",
        "zeroed block",
        "last tensor",
        "token id in the header",
        "truncated while serving",
    ],
)
def test_damaged_snapshot_is_a_counted_miss_and_deleted(tiny_engine, tmp_path, how) -> None:
    import mlx.core as mx

    path, written = write_snapshot(tiny_engine, tmp_path / "ssd")
    _, tokens = read_snapshot_header(path)
    intact = SsdCache(path.parent).restore(NS, tokens, better_than=0)
    assert intact is not None and intact[0] == tokens  # the digest passes on a good file
    keys, values, offset = intact[1][0].state  # layer 0 as it was written
    assert offset == len(tokens) and mx.array_equal(keys, written[0][0]).item()
    assert mx.array_equal(values, written[0][1]).item()
    raw = path.read_bytes()

    serving = how == "truncated while serving"  # a truncation found at start-up: below
    if not serving:
        path.write_bytes(damage(raw, how))
    restarted = SsdCache(path.parent)
    assert restarted.stats()["entries"] == 1  # the header still reads: caught on restore
    if serving:
        path.write_bytes(damage(raw, how))
    assert restarted.restore(NS, tokens, better_than=0) is None
    stats = restarted.stats()
    assert (stats["corrupt"], stats["restores"], stats["entries"], stats["bytes"]) == (1, 0, 0, 0)
    assert not path.exists()


def test_truncated_snapshot_is_deleted_at_start_up(tiny_engine, tmp_path, caplog) -> None:
    path, _ = write_snapshot(tiny_engine, tmp_path / "ssd")
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="mlxspec.engine.caches.ssd_cache"):
        ssd = SsdCache(path.parent)
    assert (ssd.stats()["entries"], ssd.stats()["corrupt"]) == (0, 1)
    assert not path.exists()
    (record,) = caplog.records
    assert record.getMessage().startswith(f"SSD snapshot {path} is unreadable (tensor '")
    assert "data bytes); deleting it" in record.getMessage()


def header_only(length: int, body: bytes) -> bytes:
    return struct.pack("<Q", length) + body


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (header_only(1 << 62, b"{}"), "header length 4611686018427387904 does not fit"),
        (b"", "0 bytes, shorter than a safetensors header"),
        (b"\x00\x00\x00", "3 bytes, shorter than a safetensors header"),
        (header_only(12, b'{"__metad": '), "the header is not JSON"),
        (header_only(4, b"\xff\xfe{}"), "the header is not JSON"),
        (header_only(2, b"[]"), "the header is not a JSON object"),
        (header_only(2, b"{}"), "no mlxspec namespace and tokens"),
    ],
    ids=["2^62 length", "zero-length", "3 bytes", "bad JSON", "not UTF-8", "array", "not ours"],
)
def test_unreadable_snapshot_is_deleted_and_start_up_goes_on(
    tiny_model_dir, tmp_path, caplog, content, reason
) -> None:
    ssd_dir = tmp_path / "ssd"
    ssd_dir.mkdir()
    bad = ssd_dir / f"{STEM}.safetensors"
    bad.write_bytes(content)
    other = ssd_dir / "model.safetensors"  # not named like a snapshot: left alone
    other.write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="mlxspec.engine.caches.ssd_cache"):
        engine = Engine.load(tiny_model_dir, "tiny-llama", ssd_cache=ssd_dir)
    try:
        stats = engine.prompt_cache.ssd.stats()
    finally:
        engine.close()
    assert (stats["entries"], stats["corrupt"], stats["bytes"]) == (0, 1, 0)
    assert not bad.exists() and other.read_bytes() == content
    (record,) = caplog.records  # one warning line, naming the file and why
    assert record.levelno == logging.WARNING and "\n" not in record.getMessage()
    assert record.getMessage().startswith(f"SSD snapshot {bad} is unreadable ({reason}")


def test_snapshot_without_digest_is_not_trusted(tiny_engine, tmp_path, caplog) -> None:
    """A snapshot written before digests existed is deleted at start-up."""
    from mlx_lm.models.cache import load_prompt_cache, save_prompt_cache

    path, _ = write_snapshot(tiny_engine, tmp_path / "ssd")

    cache, meta = load_prompt_cache(str(path), return_metadata=True)
    meta.pop("mlxspec_digest", None)
    path.unlink()
    save_prompt_cache(str(path), cache, meta)  # as older mlxspec wrote it
    assert read_snapshot_header(path) is not None
    with caplog.at_level(logging.WARNING, logger="mlxspec.engine.caches.ssd_cache"):
        ssd = SsdCache(path.parent)
    assert not path.exists()
    assert (ssd.stats()["entries"], ssd.stats()["corrupt"]) == (0, 0)
    assert [r.getMessage() for r in caplog.records] == [
        "deleted 1 SSD snapshots without a KV digest (written by an older mlxspec)"
    ]


def test_temp_files_of_live_writers_are_kept_and_abandoned_ones_deleted(tmp_path) -> None:
    ssd_dir = tmp_path / "ssd"
    ssd_dir.mkdir()
    peer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    try:
        live = ssd_dir / f".{STEM}.{peer.pid}.tmp.safetensors"
        dead = ssd_dir / f".{STEM}.{gone.pid}.tmp.safetensors"
        mine = ssd_dir / f".{STEM}.{os.getpid()}.tmp.safetensors"  # an earlier self
        dotfile = ssd_dir / ".keep.safetensors"  # not a temp name of ours
        for path in (live, dead, mine, dotfile):
            path.write_bytes(b"partial")
        ssd = SsdCache(ssd_dir)
        assert live.read_bytes() == b"partial" and dotfile.exists()
        assert not dead.exists() and not mine.exists()
        assert (ssd.stats()["entries"], ssd.stats()["bytes"], ssd.stats()["corrupt"]) == (0, 0, 0)
    finally:
        peer.kill()
        peer.wait()
    SsdCache(ssd_dir)  # its writer has died since: now it is abandoned
    assert not live.exists() and dotfile.exists()


def complete(client, prompt: str) -> dict:
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "logit_bias": {"2": -100}}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def serve_once(model_dir: Path, ssd_dir: Path, prompts: list[str]) -> tuple[list[dict], dict]:
    """Start an engine and server on ``ssd_dir``, complete ``prompts`` in turn,
    flush, and return the replies and ``/stats`` (responses checked against
    the document)."""
    from mlxspec.http.app import create_app

    engine = Engine.load(model_dir, "tiny-llama", ssd_cache=ssd_dir)
    engine.start()
    try:
        with LiveServer(create_app(engine, validate_responses=True)) as server:
            with checking_client(server.base, timeout=60) as client:
                replies = [complete(client, p) for p in prompts]
                assert client.post("/admin/cache/flush").status_code == 200
                return replies, client.get("/stats").json()
    finally:
        engine.close()


def test_poisoned_snapshot_is_prefilled_again_end_to_end(tiny_model_dir, tmp_path) -> None:
    """The issue's steps: damage the tensor data, restart, repeat the greedy
    request (then one sharing its prefix): same text as before, a full
    prefill, ``corrupt`` counted, and only good snapshots on disk after."""
    ssd_dir = tmp_path / "ssd"
    first, second = TEXT + "first", TEXT + "second"
    before, stats = serve_once(tiny_model_dir, ssd_dir, [first, second])
    assert before[1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert stats["ssd_cache"]["entries"] == 2
    good = {p: p.read_bytes() for p in ssd_dir.iterdir()}
    for path, raw in good.items():
        path.write_bytes(damage(raw, "zeroed block"))

    after, stats = serve_once(tiny_model_dir, ssd_dir, [first, second])
    assert after[0]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0  # no KV trusted
    assert [r["choices"][0]["text"] for r in after] == [r["choices"][0]["text"] for r in before]
    shared = before[1]["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert after[1]["usage"]["prompt_tokens_details"]["cached_tokens"] == shared  # fresh KV
    assert (stats["ssd_cache"]["corrupt"], stats["ssd_cache"]["restores"]) == (2, 0)
    assert stats["ssd_cache"]["entries"] == 2
    assert set(ssd_dir.iterdir()) == set(good)  # written again from the fresh prefill
    for path, raw in good.items():  # greedy and deterministic: the very bytes of before
        assert path.read_bytes() == raw
    again = SsdCache(ssd_dir)  # and they are trusted again
    for path in good:
        namespace, tokens = read_snapshot_header(path)  # the engine's, with its weights
        assert again.restore(namespace, tokens, better_than=0) is not None
    assert (again.stats()["restores"], again.stats()["corrupt"]) == (2, 0)

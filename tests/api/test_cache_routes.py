"""Prompt cache over HTTP: cached_tokens and sessions on /v1/completions, the
/admin/cache routes (checked against the document), and SIGTERM drain + flush."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.conformance.live import free_port, wait_healthy
from mlxspec.engine import Engine
from mlxspec.engine.caches.ssd_cache import SsdCache, read_snapshot_header
from tests.conftest import LiveServer

PROMPT = "the quick brown fox jumps over the lazy dog and then "
NO_EOS = {"2": -100}


def complete(client: httpx.Client, prompt: str, **extra) -> dict:
    body = {"prompt": prompt, "max_tokens": 4, "logit_bias": NO_EOS, **extra}
    response = client.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_completions_report_cached_tokens_on_a_repeated_prefix(client, tiny_engine) -> None:
    first = complete(client, PROMPT + "once")
    second = complete(client, PROMPT + "twice")
    shared = len(tiny_engine.text_prompt(PROMPT))
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] < shared
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= shared - 2


def test_chat_second_turn_reuses_the_first(client, tiny_engine) -> None:
    (x,) = tiny_engine.text_prompt("x")
    body = {"max_tokens": 2, "logit_bias": {str(x): 100}, "prompt_cache_key": "chat-1"}
    history = [{"role": "user", "content": PROMPT + "chat"}]
    first = client.post("/v1/chat/completions", json={**body, "messages": history}).json()
    assert first["choices"][0]["message"]["content"] == "xx"
    history += [
        {"role": "assistant", "content": "xx"},
        {"role": "user", "content": "and then?"},
    ]
    second = client.post("/v1/chat/completions", json={**body, "messages": history}).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= first["usage"]["prompt_tokens"] + 2
    assert cached < second["usage"]["prompt_tokens"]


@pytest.mark.parametrize(
    ("extra", "headers"),
    [
        ({"session_id": "s-body"}, {}),
        ({"prompt_cache_key": "s-key"}, {}),
        ({}, {"x-session-affinity": "s-header"}),
        ({}, {"session_id": "s-header2"}),
    ],
    ids=["session_id", "prompt_cache_key", "x-session-affinity", "session_id-header"],
)
def test_completions_session_fields_reach_the_cache(client, tiny_engine, extra, headers) -> None:
    """Turn 2 continues turn 1's prompt and answer: the session's checkpoint is used."""
    label = next(iter({**extra, **headers}.values()))
    stats = tiny_engine.prompt_cache.stats
    (x,) = tiny_engine.text_prompt("x")
    # the answer is forced to "xx", which re-encodes to the same two tokens
    turn1 = {"prompt": PROMPT + label, "max_tokens": 2, "logit_bias": {str(x): 100}, **extra}
    answer = client.post("/v1/completions", json=turn1, headers=headers).json()
    assert answer["choices"][0]["text"] == "xx"
    before = stats()
    turn2 = {**turn1, "prompt": PROMPT + label + "xx and more"}
    again = client.post("/v1/completions", json=turn2, headers=headers).json()
    after = stats()
    assert after["session_hits"] == before["session_hits"] + 1
    cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == len(tiny_engine.text_prompt(PROMPT + label)) + 2
    # Closed with the same field or header that labelled the requests.
    closed = client.post("/admin/cache/session/close", json=extra, headers=headers)
    assert closed.status_code == 200 and closed.json() == {"closed": True}
    assert stats()["sessions"] == after["sessions"] - 1
    assert stats()["entries"] == after["entries"]  # closing keeps the entries


def test_close_prefers_the_body_over_the_affinity_headers(client, tiny_engine) -> None:
    def sessions() -> int:
        return tiny_engine.prompt_cache.stats()["sessions"]

    complete(client, PROMPT + "p-body", session_id="p-body")
    complete(client, PROMPT + "p-header", session_id="p-header")
    before = sessions()
    both = {"x-session-affinity": "p-header", "session_id": "p-header"}
    url = "/admin/cache/session/close"
    assert client.post(url, json={"session_id": "p-body"}, headers=both).json() == {"closed": True}
    assert sessions() == before - 1  # p-body went, p-header stays...
    assert client.post(url, headers={"session_id": "p-header"}).json() == {"closed": True}
    assert sessions() == before - 2  # ...until the header names it
    assert client.post(url, json={"session_id": ""}, headers={"x-session-affinity": ""}).json() == {
        "closed": False
    }


@pytest.mark.parametrize("body", [{}, {"session_id": None}, {"session_id": ""}, None])
def test_close_without_an_id_closes_nothing(client, body) -> None:
    if body is None:  # no body at all reads as {}
        response = client.post("/admin/cache/session/close")
    else:
        response = client.post("/admin/cache/session/close", json=body)
    assert response.status_code == 200
    assert response.json() == {"closed": False}


def test_close_rejects_a_non_string_id(client) -> None:
    response = client.post("/admin/cache/session/close", json={"session_id": 42})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "session_id"


def test_flush_without_ssd_tier_is_durable(client) -> None:
    response = client.post("/admin/cache/flush")
    assert response.status_code == 200
    assert response.json() == SsdCache.empty_flush_report()


def test_flush_route_200_and_503(tiny_model_dir, tmp_path) -> None:
    from mlxspec.http.app import create_app

    ssd_dir = tmp_path / "ssd"
    engine = Engine.load(tiny_model_dir, "tiny-llama", ssd_cache=ssd_dir)
    engine.start()
    try:
        with LiveServer(create_app(engine, validate_responses=True)) as server:
            with checking_client(server.base, timeout=60) as c:
                complete(c, PROMPT + "kept")
                ok = c.post("/admin/cache/flush")
                assert ok.status_code == 200
                assert (ok.json()["durable"], ok.json()["entries"]) == (True, 1)
                stats = c.get("/stats").json()
                assert stats["ssd_cache"]["dir"] == str(ssd_dir)
                assert stats["ssd_cache"]["entries"] == 1
                assert stats["ssd_cache"]["pending_snapshots"] == 0
                assert stats["prompt_cache"]["entries"] >= 1
                shutil.rmtree(ssd_dir)
                ssd_dir.write_text("not a directory")  # the next writes fail
                complete(c, PROMPT + "lost")
                failed = c.post("/admin/cache/flush")
                assert failed.status_code == 503
                report = failed.json()
                # the new snapshot and the first one (its file went with the
                # directory; RAM still holds it) both fail to be written
                assert (report["durable"], report["failedSpills"]) == (False, 2)
                assert (report["pendingSnapshots"], report["entries"]) == (2, 0)
                ssd_dir.unlink()
                ssd_dir.mkdir()
                retried = c.post("/admin/cache/flush")
                assert retried.status_code == 200
                assert (retried.json()["flushedSnapshots"], retried.json()["entries"]) == (2, 2)
    finally:
        engine.close()


def test_sigterm_drains_the_stream_then_flushes(tiny_model_dir, tmp_path) -> None:
    """A stream in flight when SIGTERM arrives finishes; its snapshot is on disk
    when the process exits 0."""
    port, ssd_dir = free_port(), tmp_path / "ssd"
    argv = [sys.executable, "-m", "mlxspec", "serve", str(tiny_model_dir), "--port", str(port)]
    argv += ["--ssd-cache", str(ssd_dir), "--batch", "1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, 60)
        body = {"prompt": PROMPT, "max_tokens": 150, "logit_bias": NO_EOS, "stream": True}
        body["stream_options"] = {"include_usage": True}
        frames = []
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as response:
            for line in response.iter_lines():
                if not line.startswith("data: "):
                    continue
                if not frames:
                    proc.send_signal(signal.SIGTERM)
                frames.append(line.removeprefix("data: "))
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert frames[-1] == "[DONE]"
    last = {**json.loads(frames[-3]), "usage": json.loads(frames[-2])["usage"]}
    assert last["choices"][0]["finish_reason"] == "length"
    assert last["usage"]["completion_tokens"] == 150
    snapshots = [p for p in ssd_dir.iterdir() if p.suffix == ".safetensors"]
    assert len(snapshots) == 1
    _, tokens = read_snapshot_header(snapshots[0])
    assert len(tokens) == last["usage"]["prompt_tokens"] + 150
    with proc.stdout:
        assert b"prompt cache flush: durable=True entries=1" in proc.stdout.read()


def test_a_second_sigint_during_the_drain_exits_at_once_without_tracebacks(
    tiny_model_dir,
) -> None:
    """The first SIGINT drains; a second while requests are in flight (streams
    decoding, and a body that stopped arriving, which holds the drain for
    BODY_IDLE_TIMEOUT_S) exits with 130 and one line, no traceback."""
    port = free_port()
    argv = [sys.executable, "-m", "mlxspec", "serve", str(tiny_model_dir), "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [*argv, "--batch", "1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, b"")))
    reader.start()
    base = f"http://127.0.0.1:{port}"
    started, finished = threading.Event(), []

    def stream() -> None:
        body = {"prompt": PROMPT, "max_tokens": 150, "logit_bias": NO_EOS, "stream": True}
        body["stream_options"] = {"include_usage": True}
        with contextlib.suppress(httpx.HTTPError):
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=60) as r:
                for _ in r.iter_lines():
                    started.set()
        finished.append(True)

    def wait_for(text: bytes) -> None:
        deadline = time.monotonic() + 30
        while not any(text in line for line in lines):
            assert time.monotonic() < deadline and proc.poll() is None, b"".join(lines)
            time.sleep(0.05)

    stalled = socket.socket()
    try:
        wait_healthy(base, 60)
        stalled.connect(("127.0.0.1", port))
        stalled.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
        )
        streams = [threading.Thread(target=stream) for _ in range(3)]
        for t in streams:
            t.start()
        assert started.wait(30)
        proc.send_signal(signal.SIGINT)
        wait_for(b"Waiting for connections to close")
        assert len(finished) < len(streams)  # streams were still decoding (batch 1)
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        status = proc.wait(15)
        elapsed = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)
        proc.stdout.close()
        stalled.close()
    for t in streams:
        t.join(30)
    output = b"".join(lines).decode()
    assert status == 128 + signal.SIGINT, output
    assert elapsed < 5, output
    assert "Traceback" not in output and "Error" not in output, output
    assert output.splitlines()[-1] == "mlxspec: SIGINT: forced exit, requests in flight dropped"


def test_cache_flags() -> None:
    from mlxspec.cli.flags import parse_config
    from mlxspec.config import ServeConfig

    cfg = parse_config(
        ["serve", "--prompt-cache-bytes", "512M", "--ssd-cache", "/x", "--ssd-cache-bytes", "2G"]
    )
    assert (cfg.prompt_cache_bytes, cfg.ssd_cache, cfg.ssd_cache_bytes) == (
        512 << 20,
        "/x",
        2 << 30,
    )
    assert parse_config(["serve", "--prompt-cache-bytes", "0"]).prompt_cache_bytes == 0
    assert parse_config(["serve", "--prompt-cache-bytes", "1024"]).prompt_cache_bytes == 1024
    assert ServeConfig().prompt_cache_bytes == 1 << 30 and ServeConfig().ssd_cache is None


@pytest.mark.parametrize("size", ["lots", "-1", "1X"])
def test_bad_cache_size_exits_2(size: str) -> None:
    from mlxspec.cli.flags import parse_config

    with pytest.raises(SystemExit) as err:
        parse_config(["serve", "--prompt-cache-bytes", size])
    assert err.value.code == 2


def test_unusable_ssd_cache_dir_exits_2(tmp_path, capsys) -> None:
    """Refused before the model load, with a one-line reason."""
    from mlxspec.cli.main import serve
    from mlxspec.config import ServeConfig

    blocker = tmp_path / "file"
    blocker.write_text("")
    config = ServeConfig(port=free_port(), ssd_cache=str(blocker / "ssd"))
    assert serve(config) == 2
    assert capsys.readouterr().err == (
        f"mlxspec: error: cannot use --ssd-cache {blocker / 'ssd'}: Not a directory\n"
    )

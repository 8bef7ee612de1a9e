"""``mlxspec serve --isolate`` with real processes (issue 29 item 2): the parent
proxies every route to a worker child on the tiny model, restarts a child killed
with SIGKILL, answers 502 engine_unavailable while a child cannot serve, and
never exposes the worker routes on TCP, and keeps the Responses store in the
parent, so a chain goes on across a child's restart."""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxspec.conformance.live import serve

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 8, "temperature": 0}


def _argv(model: Path | str, *flags: str) -> list[str]:
    return [sys.executable, "-m", "mlxspec", "serve", str(model), "--port", "{port}", *flags]


@pytest.fixture(scope="module")
def parent(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    log = tmp_path_factory.mktemp("isolate") / "parent.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with serve(
        _argv(tiny_model_dir, "--isolate", "--whisper-model", "none"), env, log, 180
    ) as base:
        yield base


def _engine(base: str) -> dict[str, Any]:
    return httpx.get(f"{base}/engine", timeout=10).json()


def _until_ready(base: str, timeout: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (status := _engine(base))["state"] == "ready":
            return status
        time.sleep(0.2)
    raise TimeoutError(f"child not ready: {status}")


def _normalized(stream: bytes) -> bytes:
    """A chat stream with its per-request values (id, created) blanked."""
    stream = re.sub(rb'"id":"chatcmpl-[0-9a-f-]+"', b'"id":"X"', stream)
    return re.sub(rb'"created":\d+', b'"created":0', stream)


def test_engine_reports_the_child(parent: str) -> None:
    status = _until_ready(parent)
    assert status["isolated"] is True
    assert isinstance(status["pid"], int) and status["pid"] != os.getpid()
    assert status["socket"].endswith(".sock")
    assert oct(os.stat(Path(status["socket"]).parent).st_mode & 0o777) == "0o700"
    assert "pool" not in status
    assert status["response_store"]["max_bytes"] == 32 * 1024 * 1024  # the parent's store


@pytest.mark.parametrize("path", ["/admin/drain", "/admin/lease"])
def test_worker_routes_are_refused_on_the_parent_port(parent: str, path: str) -> None:
    answer = httpx.post(f"{parent}{path}", timeout=10)
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == "not found"


def test_stream_through_the_proxy_equals_the_childs_own(parent: str) -> None:
    socket = _until_ready(parent)["socket"]
    body = {**CHAT, "stream": True}
    via_parent = httpx.post(f"{parent}/v1/chat/completions", json=body, timeout=60)
    direct = httpx.Client(transport=httpx.HTTPTransport(uds=socket), base_url="http://localhost")
    with direct:
        own = direct.post("/v1/chat/completions", json=body, timeout=60)
    assert via_parent.headers["content-type"] == own.headers["content-type"]
    assert via_parent.content.endswith(b"data: [DONE]\n\n")
    assert _normalized(via_parent.content) == _normalized(own.content)


def test_anthropic_and_validation_errors_come_from_the_child(parent: str) -> None:
    answer = httpx.post(f"{parent}/v1/messages", json={"messages": []}, timeout=30)
    assert answer.status_code == 400
    assert answer.json()["type"] == "error"  # Anthropic's envelope, the child's


def test_a_client_that_leaves_cancels_the_childs_request(parent: str) -> None:
    _until_ready(parent)
    before = httpx.get(f"{parent}/stats", timeout=10).json()["requests"]["cancelled"]
    body = {**CHAT, "stream": True, "max_tokens": 200}
    with httpx.stream("POST", f"{parent}/v1/chat/completions", json=body, timeout=60) as answer:
        next(answer.iter_raw())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = httpx.get(f"{parent}/stats", timeout=10).json()["requests"]
        if stats["cancelled"] > before:
            break
        time.sleep(0.2)
    assert stats["cancelled"] == before + 1


def test_web_chat_socket_through_the_proxy(parent: str) -> None:
    from tests.webchat_client import ChatClient

    _until_ready(parent)
    with ChatClient(parent) as chat:
        assert chat.greeting["ready"]["model"] == "tiny-llama"


#: Responses stored before the SIGKILL test's restart, continued after it.
CHAIN: dict[str, dict[str, Any]] = {}


def _respond(base: str, **body: Any) -> dict[str, Any]:
    answer = httpx.post(
        f"{base}/v1/responses",
        json={"max_output_tokens": 6, "temperature": 0, **body},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_sigkill_mid_stream_then_the_restarted_child_serves(parent: str) -> None:
    """(It also leaves :data:`CHAIN` stored before the kill, for the next test:
    one restart serves both, each costs a model load.)"""
    status = _until_ready(parent)
    CHAIN["first"] = _respond(parent, input="Tell me a story.", instructions="Be brief.")
    CHAIN["unstored"] = _respond(parent, input="Forget this.", store=False)
    stored = status["response_store"]["entries"] + 1  # in the parent; store: false is not
    assert _engine(parent)["response_store"]["entries"] == stored
    pid, restarts = status["pid"], status["restarts"]
    body = {**CHAT, "stream": True, "max_tokens": 200}
    with httpx.stream("POST", f"{parent}/v1/chat/completions", json=body, timeout=60) as answer:
        chunks = answer.iter_raw()
        received = next(chunks)
        os.kill(pid, signal.SIGKILL)
        received += b"".join(chunks)  # ends: never a hang
    last = received.rstrip(b"\n").rsplit(b"\n\n", 1)[-1]
    assert json.loads(last.removeprefix(b"data: "))["error"]["type"] == "engine_unavailable"
    status = _until_ready(parent)
    assert status["restarts"] == restarts + 1 and status["pid"] != pid
    answer = httpx.post(f"{parent}/v1/chat/completions", json=CHAT, timeout=60)
    assert answer.status_code == 200
    assert answer.json()["usage"]["completion_tokens"] == 8


def test_a_responses_chain_survives_the_childs_restart(parent: str) -> None:
    if "first" not in CHAIN:  # run alone: store them, then restart the child
        test_sigkill_mid_stream_then_the_restarted_child_serves(parent)
    first, unstored = CHAIN["first"], CHAIN["unstored"]
    status = _until_ready(parent)
    assert status["restarts"] >= 1 and status["response_store"]["entries"] >= 1
    # the new child reads the parent's store: the stored one, not the unstored one
    again = httpx.get(f"{parent}/v1/responses/{first['id']}", timeout=30)
    assert again.status_code == 200 and again.json() == first
    gone = httpx.get(f"{parent}/v1/responses/{unstored['id']}", timeout=30)
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "response_not_found"
    second = _respond(parent, input="And then?", previous_response_id=first["id"])
    assert second["previous_response_id"] == first["id"]
    assert second["instructions"] == "Be brief."  # carried forward from the stored turn
    # the same history sent whole, unstored, gives the same prompt and greedy answer
    history = [
        {"role": "user", "content": "Tell me a story."},
        {"role": "assistant", "content": first["output"][0]["content"][0]["text"]},
        {"role": "user", "content": "And then?"},
    ]
    whole = _respond(parent, input=history, instructions="Be brief.", store=False)
    assert second["usage"]["input_tokens"] == whole["usage"]["input_tokens"]
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"] + 4
    assert second["output"][0]["content"] == whole["output"][0]["content"]
    # deleting through the new child removes it from the parent: the chain ends there
    deleted = httpx.delete(f"{parent}/v1/responses/{first['id']}", timeout=30)
    assert deleted.status_code == 200 and deleted.json()["deleted"] is True
    refused = httpx.post(
        f"{parent}/v1/responses",
        json={"input": "More.", "previous_response_id": first["id"], "max_output_tokens": 2},
        timeout=30,
    )
    assert refused.status_code == 404
    assert refused.json()["error"]["code"] == "response_not_found"

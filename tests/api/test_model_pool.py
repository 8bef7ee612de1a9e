"""``--isolate --model-pool`` with real processes (issue 29 item 3 of the issue,
item 4 of the brief): the embedded model as the default and two tiny random
models, one child each; the body's ``model`` picks the child, ``--pool-max-resident
1`` evicts the least recently used one, ``keep_alive`` unloads, a model folder
that cannot load is a 502 while the others keep serving."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fixtures.tiny_model import build_tiny_llama
from mlxspec.conformance.live import serve

#: The default child serves the embedded model (read from a subprocess, so marked by hand).
pytestmark = pytest.mark.real_model

EMBEDDED = "SmolLM2-135M-Instruct"
GREEDY = {"max_tokens": 8, "temperature": 0, "logprobs": True}


@pytest.fixture(scope="module")
def pool(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("pool")
    other = build_tiny_llama(root / "tiny-other", seed=7)
    broken = root / "broken-model"
    broken.mkdir()  # no config.json: its child exits at once
    argv = [
        sys.executable,
        "-m",
        "mlxspec",
        "serve",
        "--port",
        "{port}",
        "--isolate",
        "--whisper-model",
        "none",
        "--pool-max-resident",
        "1",
        "--model-pool",
        str(tiny_model_dir),
        str(other),
        str(broken),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with serve(argv, env, root / "parent.log", 300) as base:
        yield base


def _chat(base: str, model: str, **extra: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "hello"}], **GREEDY, **extra}
    return httpx.post(f"{base}/v1/chat/completions", json=body, timeout=300)


def _respond(base: str, model: str, **body: Any) -> dict[str, Any]:
    body = {"model": model, "max_output_tokens": 4, "temperature": 0, **body}
    answer = httpx.post(f"{base}/v1/responses", json=body, timeout=300)
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == model
    return answer.json()


def _engine(base: str) -> dict[str, Any]:
    return httpx.get(f"{base}/engine", timeout=10).json()


def _until(predicate: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_models_lists_the_pool_with_the_default_resident(pool: str) -> None:
    rows = httpx.get(f"{pool}/v1/models", timeout=10).json()["data"]
    rows = [r for r in rows if "resident" in r]  # the pool's rows (then the library's)
    assert [r["id"] for r in rows] == [EMBEDDED, "tiny-llama", "tiny-other", "broken-model"]
    assert {r["id"]: r["resident"] for r in rows}[EMBEDDED] is True
    one = httpx.get(f"{pool}/v1/models/tiny-other", timeout=10).json()["data"]
    assert [(r["id"], r["resident"]) for r in one] == [("tiny-other", False)]
    assert httpx.get(f"{pool}/v1/models/nope", timeout=10).status_code == 404
    status = _engine(pool)
    assert status["pool"]["default"] == EMBEDDED
    assert status["pool"]["models"] == [r["id"] for r in rows]


def test_the_body_model_routes_and_evicts_the_least_recently_used(
    pool: str, client: httpx.Client
) -> None:
    embedded = _chat(
        pool,
        EMBEDDED,
        messages=[
            {"role": "user", "content": "What is the capital of France? Answer in one word."}
        ],
    )
    assert embedded.status_code == 200
    assert "Paris" in embedded.json()["choices"][0]["message"]["content"]
    default_pid = _engine(pool)["pid"]

    tiny = _chat(pool, "tiny-llama")  # the embedded child is evicted to make room
    assert tiny.status_code == 200 and tiny.json()["model"] == "tiny-llama"
    direct = client.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hello"}], **GREEDY}
    )
    assert tiny.json()["choices"][0]["message"] == direct.json()["choices"][0]["message"]
    assert tiny.json()["choices"][0]["logprobs"] == direct.json()["choices"][0]["logprobs"]
    status = _engine(pool)
    assert status["pool"]["resident"] == ["tiny-llama"]
    assert status["pid"] is None and status["socket"] is None  # the default is evicted
    assert _gone(default_pid)

    first = _respond(pool, "tiny-llama", input="Tell me a story.")
    other = _chat(pool, "tiny-other")
    assert other.status_code == 200
    assert other.json()["model"] == "tiny-other"  # the id its own engine echoes
    assert _engine(pool)["pool"]["resident"] == ["tiny-other"]
    rows = httpx.get(f"{pool}/v1/models", timeout=10).json()["data"]
    assert [r["id"] for r in rows if r.get("resident")] == ["tiny-other"]

    # the parent keeps the Responses store: a chain begun on tiny-llama, whose
    # child was evicted meanwhile, goes on on tiny-other
    second = _respond(pool, "tiny-other", input="More.", previous_response_id=first["id"])
    assert second["model"] == "tiny-other" and second["previous_response_id"] == first["id"]
    assert second["usage"]["input_tokens"] > first["usage"]["input_tokens"] + 4
    assert _engine(pool)["response_store"]["entries"] >= 2


def test_keep_alive_zero_unloads_after_the_request(pool: str) -> None:
    assert _engine(pool)["pool"]["resident"] == ["tiny-other"]
    assert _chat(pool, "tiny-other", keep_alive=0).status_code == 200
    # the next request while it is being stopped waits and starts it again (was a 502)
    assert _chat(pool, "tiny-other", keep_alive=0).status_code == 200
    _until(lambda: _engine(pool)["pool"]["resident"] == [])


def test_a_model_that_cannot_load_is_502_and_the_others_serve(pool: str) -> None:
    answer = _chat(pool, "broken-model")
    assert answer.status_code == 502
    error = answer.json()["error"]
    assert error["type"] == "engine_unavailable"
    assert "broken-model failed to start" in error["message"]
    body = {
        "model": "broken-model",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": "x"}],
    }
    anthropic = httpx.post(f"{pool}/v1/messages", json=body, timeout=120)
    assert anthropic.status_code == 502 and anthropic.json()["type"] == "error"
    # another model still starts and serves; keep_alive in seconds unloads it when idle
    assert _chat(pool, "tiny-llama", keep_alive="2s").status_code == 200
    assert _engine(pool)["pool"]["resident"] == ["tiny-llama"]
    _until(lambda: _engine(pool)["pool"]["resident"] == [], timeout=30)

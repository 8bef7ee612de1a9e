"""Worker mode (issue 29 item 1): ``--unix`` serves the API on a unix socket
(mode 0600) with ``POST /admin/drain`` and ``POST /admin/lease``, which a TCP
server never has (reference, route index, "Internal routes")."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mlxspec.config import ServeConfig

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def _call(app: object, method: str, path: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            return await c.request(method, path)

    return asyncio.run(go())


@pytest.mark.parametrize("path", ["/admin/drain", "/admin/lease"])
def test_worker_routes_are_404_on_tcp(tiny_app: object, path: str) -> None:
    answer = _call(tiny_app, "POST", path)
    assert answer.status_code == 404
    assert answer.json()["error"]["type"] == "not_found_error"


def test_engine_route_is_404_on_a_direct_server(tiny_app: object) -> None:
    assert _call(tiny_app, "GET", "/engine").status_code == 404


class UnixServer:
    """uvicorn on a unix socket in a thread, as ``mlxspec serve --unix`` binds it."""

    def __init__(self, app: object, config: ServeConfig) -> None:
        import uvicorn

        from mlxspec.http.connections import bind_unix, uvicorn_config

        assert config.unix is not None
        self.path = config.unix
        self.sock = bind_unix(config.unix)
        self.server = uvicorn.Server(
            uvicorn_config(app, dataclasses.replace(config, log_level="warning"))
        )
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def client(self, timeout: float = 30) -> httpx.Client:
        transport = httpx.HTTPTransport(uds=self.path)
        return httpx.Client(transport=transport, base_url="http://localhost", timeout=timeout)

    def __enter__(self) -> UnixServer:
        self.thread.start()
        with self.client() as c:
            for _ in range(100):
                try:
                    if c.get("/health").status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                threading.Event().wait(0.1)
        raise TimeoutError("unix server not healthy")

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture()
def worker(tiny_engine: object, tmp_path: Path) -> Iterator[UnixServer]:
    from mlxspec.http.app import create_app

    config = ServeConfig(unix=str(tmp_path / "engine.sock"))
    with UnixServer(create_app(tiny_engine, config, validate_responses=True), config) as server:
        yield server


def test_worker_socket_is_private_and_serves_the_api(worker: UnixServer) -> None:
    assert stat.S_IMODE(os.stat(worker.path).st_mode) == 0o600
    with worker.client() as c:
        answer = c.post("/v1/chat/completions", json=CHAT)
        assert answer.status_code == 200
        assert answer.json()["usage"]["completion_tokens"] == 2


def test_drain_answers_drained_and_demotions(worker: UnixServer) -> None:
    with worker.client() as c:
        answer = c.post("/admin/drain")
    assert answer.status_code == 200
    assert answer.json() == {"drained": True, "demotions": 0}  # no SSD tier: nothing moves


def test_lease_holds_the_engine_until_its_connection_closes(worker: UnixServer) -> None:
    with worker.client() as lease_client, lease_client.stream("POST", "/admin/lease") as lease:
        assert lease.status_code == 200
        lines = lease.iter_lines()  # kept: a dropped iterator closes the connection
        assert json.loads(next(lines)) == {"leased": True}
        with worker.client(timeout=2) as c, pytest.raises(httpx.ReadTimeout):
            c.post("/v1/chat/completions", json=CHAT)  # the engine thread is leased
    with worker.client() as c:  # the lease's connection closed: released
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_drain_demotes_the_prompt_cache_to_the_ssd_tier(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    from mlxspec.engine import Engine, GenerationRequest

    engine = Engine.load(tiny_model_dir, "tiny-llama", ssd_cache=tmp_path / "ssd")
    engine.start()
    try:
        prompt = engine.text_prompt("a prompt long enough to be kept in the prompt cache")

        async def generate() -> None:
            handle = engine.submit(GenerationRequest(prompt=tuple(prompt), max_tokens=2))
            async for _ in handle:
                pass

        asyncio.run(generate())
        assert engine.cache_stats()["prompt_cache"]["entries"] >= 1
        assert engine.drain(30) >= 1
        assert engine.cache_stats()["prompt_cache"]["entries"] == 0
        assert engine.cache_stats()["ssd_cache"]["entries"] >= 1
    finally:
        engine.close()

"""``/v1/responses`` while a response runs: ``background: true`` (answered at
once, polled with ``GET``, stopped with ``POST .../cancel``) and ``GET`` of a
response that is still streaming.

Each test holds its own engine unstarted until it wants generation to begin,
so ``queued`` is observed deterministically; every response is checked
against the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mlxspec.conformance.httpx_checks import checking_async_client, checking_client
from mlxspec.engine import Engine
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.helpers import openai_sdk

BODY = {"input": "hello there", "max_output_tokens": 6, "temperature": 0}


@pytest.fixture()
def held_engine(tiny_model_dir: Path) -> Iterator[Engine]:
    """An engine not started yet: requests stay queued until the test starts it."""
    engine = Engine.load(tiny_model_dir, "tiny-llama")
    yield engine
    engine.close()


async def _until_done(c: httpx.AsyncClient, response_id: str) -> dict:
    """Poll ``GET /v1/responses/{id}`` until the response has ended."""
    for _ in range(600):
        got = (await c.get(f"/v1/responses/{response_id}")).json()
        if got["status"] not in ("queued", "in_progress"):
            return got
        await asyncio.sleep(0.05)
    raise AssertionError("the background response never ended")


def _text(response: dict) -> str:
    return "".join(
        part["text"]
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
    )


def test_background_is_queued_then_ends_as_the_same_request_run_inline(
    held_engine: Engine,
) -> None:
    app = create_app(held_engine, validate_responses=True)

    async def go() -> tuple[dict, dict, dict, dict]:
        transport = httpx.ASGITransport(app=app)
        async with checking_async_client("http://localhost", transport=transport, timeout=60) as c:
            created = await c.post("/v1/responses", json={**BODY, "background": True})
            assert created.status_code == 200, created.text
            polled = (await c.get(f"/v1/responses/{created.json()['id']}")).json()
            held_engine.start()
            done = await _until_done(c, created.json()["id"])
            inline = (await c.post("/v1/responses", json=BODY)).json()
        return created.json(), polled, done, inline

    created, polled, done, inline = asyncio.run(go())
    assert (created["status"], created["background"], created["output"]) == ("queued", True, [])
    assert created["usage"] is None
    assert polled["status"] == "queued"  # the engine has not started it
    assert done["id"] == created["id"]
    assert done["status"] == inline["status"] == "incomplete"  # 6 tokens, no EOS in reach
    assert done["usage"]["output_tokens"] == inline["usage"]["output_tokens"] == 6
    assert _text(done) == _text(inline) != ""
    assert inline["background"] is False


def test_cancel_a_queued_background_response(held_engine: Engine) -> None:
    app = create_app(held_engine, validate_responses=True)

    async def go() -> tuple[dict, dict, dict, dict, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with checking_async_client("http://localhost", transport=transport, timeout=60) as c:
            created = (await c.post("/v1/responses", json={**BODY, "background": True})).json()
            route = f"/v1/responses/{created['id']}"
            # a running response cannot be continued yet
            follow = await c.post(
                "/v1/responses", json={**BODY, "previous_response_id": created["id"]}
            )
            cancelled = await c.post(f"{route}/cancel")
            assert cancelled.status_code == 200, cancelled.text
            again = (await c.post(f"{route}/cancel")).json()  # idempotent
            held_engine.start()
            after = (await c.get(route)).json()
            # it was stored: a continuation now runs
            later = await c.post(
                "/v1/responses", json={**BODY, "previous_response_id": created["id"]}
            )
        return created, cancelled.json(), again, after, follow, later

    created, cancelled, again, after, follow, later = asyncio.run(go())
    assert follow.status_code == 400
    assert follow.json()["error"] == {
        "message": f"response '{created['id']}' is still running; continue from it once it "
        "has finished",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": None,
    }
    assert cancelled["status"] == again["status"] == after["status"] == "cancelled"
    assert cancelled["id"] == created["id"]
    assert later.status_code == 200
    assert held_engine.counters["cancelled"] == 1


def test_cancel_is_only_for_background_responses(client: httpx.Client) -> None:
    inline = client.post("/v1/responses", json=BODY).json()
    refused = client.post(f"/v1/responses/{inline['id']}/cancel")
    assert refused.status_code == 400
    assert refused.json()["error"] == {
        "message": "only responses created with background: true can be cancelled",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": None,
    }
    missing = client.post("/v1/responses/resp_nope/cancel")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "response_not_found"


def test_background_needs_store(client: httpx.Client) -> None:
    r = client.post("/v1/responses", json={**BODY, "background": True, "store": False})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "background"
    assert r.json()["error"]["message"] == (
        "background responses must be stored: background: true cannot be combined with store: false"
    )


def test_openai_sdk_background_retrieve_and_cancel(tiny_server: LiveServer) -> None:
    with openai_sdk(tiny_server.base) as sdk:
        started = sdk.responses.create(model="m", **BODY, background=True)
        assert started.background is True
        assert started.status in ("queued", "in_progress", "incomplete")
        for _ in range(600):
            got = sdk.responses.retrieve(started.id)
            if got.status not in ("queued", "in_progress"):
                break
        assert got.status == "incomplete"
        assert got.usage is not None and got.usage.output_tokens == 6
        assert sdk.responses.cancel(started.id).status == "incomplete"  # it had finished


def test_get_answers_while_a_response_streams(held_engine: Engine) -> None:
    app = create_app(held_engine, validate_responses=True)
    with (
        LiveServer(app) as server,
        checking_client(server.base, timeout=60) as c,
        c.stream("POST", "/v1/responses", json={**BODY, "stream": True}) as stream,
    ):
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        response_id = json.loads(first[len("data: ") :])["response"]["id"]
        running = c.get(f"/v1/responses/{response_id}").json()
        held_engine.start()
        rest = [line for line in lines if line.startswith("data: ")]
        final = json.loads(rest[-1][len("data: ") :])["response"]
        stored = c.get(f"/v1/responses/{response_id}").json()
    assert (running["status"], running["output"]) == ("queued", [])
    assert final["status"] == "incomplete"
    assert stored == final


def test_cancel_a_background_stream(held_engine: Engine) -> None:
    app = create_app(held_engine, validate_responses=True)
    body = {**BODY, "stream": True, "background": True}
    with (
        LiveServer(app) as server,
        checking_client(server.base, timeout=60) as c,
        c.stream("POST", "/v1/responses", json=body) as stream,
    ):
        lines = stream.iter_lines()
        first = next(line for line in lines if line.startswith("data: "))
        response_id = json.loads(first[len("data: ") :])["response"]["id"]
        cancelled = c.post(f"/v1/responses/{response_id}/cancel")
        rest = [line for line in lines if line.startswith("data: ")]
        kept = c.get(f"/v1/responses/{response_id}")
        again = c.post(f"/v1/responses/{response_id}/cancel")
    assert cancelled.status_code == 200
    assert (cancelled.json()["status"], cancelled.json()["background"]) == ("cancelled", True)
    assert json.loads(rest[-1][len("data: ") :])["type"] == "response.failed"
    # a background stream that stopped early is stored as cancelled
    assert (kept.status_code, kept.json()["status"]) == (200, "cancelled")
    assert again.json() == kept.json()


def test_running_responses_refuse_delete_and_stream_resumption(held_engine: Engine) -> None:
    app = create_app(held_engine, validate_responses=True)

    async def go() -> tuple[httpx.Response, httpx.Response, dict]:
        transport = httpx.ASGITransport(app=app)
        async with checking_async_client("http://localhost", transport=transport, timeout=60) as c:
            created = (await c.post("/v1/responses", json={**BODY, "background": True})).json()
            route = f"/v1/responses/{created['id']}"
            deleted = await c.delete(route)
            resumed = await c.get(route, params={"stream": "true"})
            held_engine.start()
            done = await _until_done(c, created["id"])
            assert (await c.delete(route)).status_code == 200  # finished: it may go
        return deleted, resumed, done

    deleted, resumed, done = asyncio.run(go())
    assert deleted.status_code == 400
    assert deleted.json()["error"]["message"].endswith(
        "is still running; cancel it or let it finish first"
    )
    assert (resumed.status_code, resumed.json()["error"]["param"]) == (400, "stream")
    assert done["status"] == "incomplete"
    assert done["completed_at"] is None  # incomplete responses have no completion time

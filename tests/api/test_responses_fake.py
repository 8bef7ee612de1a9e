"""``/v1/responses`` over the scripted fake engine (``tests/fakes.py``): failures
mid-stream and before the reply (never stored), the cache-session labels
reaching the engine, and the SSE writer's named frames at the byte level."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxspec.conformance.contract import ContractViolation, check_response, split_named_event_stream
from mlxspec.engine import Delta, Failed, Finished
from mlxspec.errors import ApiError
from mlxspec.http import sse
from mlxspec.http.app import create_app
from tests.fakes import FakeEngine


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> object:
    from mlx_lm.tokenizer_utils import load

    return load(tiny_model_dir)


class StateSpy:
    """ASGI wrapper that keeps the ``scope["state"]`` the app filled in (the
    engine, the Responses store, ...)."""

    def __init__(self, app: Any) -> None:
        self.app, self.state = app, {}

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        await self.app({**scope, "state": self.state}, receive, send)


def app_client(events: list, tokenizer: object) -> tuple[FakeEngine, StateSpy, httpx.AsyncClient]:
    """A fake engine, the app on it (spied), and an in-process client of the app."""
    engine = FakeEngine(tokenizer)
    engine.script = events
    app = StateSpy(create_app(engine, validate_responses=True))
    client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")
    return engine, app, client


FAILING = [Delta("Hel"), Delta("lo"), Failed("generation failed")]
DONE = [Delta("Hello"), Finished("stop", prompt_tokens=9, completion_tokens=2)]


def test_a_failure_mid_stream_sends_error_then_response_failed_and_stores_nothing(
    tokenizer: object,
) -> None:
    async def run() -> tuple[list, int]:
        _, _, client = app_client(FAILING, tokenizer)
        async with client:
            r = await client.post("/v1/responses", json={"input": "hi", "stream": True})
            events = split_named_event_stream(r.content)
            rid = json.loads(events[0][1])["response"]["id"]
            missing = await client.get(f"/v1/responses/{rid}")
        return events, missing.status_code

    events, missing = asyncio.run(run())
    names = [name for name, _ in events]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "error",
        "response.failed",
    ]
    error = json.loads(events[-2][1])
    assert error == {
        "type": "error",
        "code": "server_error",
        "message": "generation failed",
        "param": None,
        "sequence_number": 6,
    }
    failed = json.loads(events[-1][1])["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "server_error", "message": "generation failed"}
    assert missing == 404


def test_a_failure_before_the_reply_is_a_500_and_stores_nothing(tokenizer: object) -> None:
    async def run() -> tuple[httpx.Response, dict]:
        _, app, client = app_client(FAILING, tokenizer)
        async with client:
            r = await client.post("/v1/responses", json={"input": "hi"})
        return r, app.state["response_store"].stats()

    r, stats = asyncio.run(run())
    assert r.status_code == 500
    assert r.json() == {
        "error": {
            "message": "generation failed",
            "type": "server_error",
            "param": None,
            "code": None,
        }
    }
    assert stats["entries"] == 0


@pytest.mark.parametrize(
    ("body", "headers", "session"),
    [
        ({"session_id": "s-1", "prompt_cache_key": "k-1"}, {"x-session-affinity": "h-1"}, "s-1"),
        ({"prompt_cache_key": "k-1"}, {"x-session-affinity": "h-1"}, "k-1"),
        ({}, {"x-session-affinity": "h-1", "session_id": "h-2"}, "h-1"),
        ({}, {"session_id": "h-2"}, "h-2"),
        ({}, {}, None),
    ],
)
def test_cache_session_fields_reach_the_engine(
    body: dict, headers: dict, session, tokenizer: object
) -> None:
    async def run() -> FakeEngine:
        engine, _, client = app_client(DONE, tokenizer)
        async with client:
            r = await client.post("/v1/responses", json={"input": "hi", **body}, headers=headers)
            assert r.status_code == 200, r.text
        return engine

    engine = asyncio.run(run())
    assert engine.requests[0].session == session


def test_the_stored_conversation_is_what_the_engine_sees_next(tokenizer: object) -> None:
    async def run() -> FakeEngine:
        engine, _, client = app_client(DONE, tokenizer)
        async with client:
            body = {"input": "hi", "instructions": "Be brief."}
            first = (await client.post("/v1/responses", json=body)).json()
            body = {"input": "more", "previous_response_id": first["id"]}
            assert (await client.post("/v1/responses", json=body)).status_code == 200
        return engine

    engine = asyncio.run(run())
    assert engine.chats[1] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "more"},
    ]


def test_named_frames_at_the_byte_level() -> None:
    assert sse.named_frame("response.created", {"a": "x\u2028y"}) == (
        b'event: response.created\ndata: {"a":"x\\u2028y"}\n\n'
    )
    with pytest.raises(ValueError, match="one line"):
        sse.named_frame("bad\nname", {})


def test_named_events_close_with_the_error_frames_and_always_clean_up() -> None:
    closed: list[bool] = []

    async def frames() -> AsyncIterator[tuple[str, dict] | bytes]:
        yield "a", {"type": "a"}
        yield sse.KEEPALIVE
        raise ApiError("server_error", "boom")

    def on_error(err: ApiError) -> list[tuple[str, dict]]:
        return [("error", {"type": "error", "message": err.message})]

    async def run() -> bytes:
        out = [f async for f in sse.named_events(frames(), on_error, lambda: closed.append(True))]
        return b"".join(out)

    assert asyncio.run(run()) == (
        b'event: a\ndata: {"type":"a"}\n\n: keep-alive\n\n'
        b'event: error\ndata: {"type":"error","message":"boom"}\n\n'
    )
    assert closed == [True]


# --- the contract's named-event stream rules catch their breaches -----------------

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
RESPONSE = {"id": "resp_1", "object": "response", "created_at": 1, "status": "in_progress"}
RESPONSE = {**RESPONSE, "model": "m", "output": [], "usage": None}


def named(*events: tuple[str, dict]) -> bytes:
    return b"".join(sse.named_frame(name, payload) for name, payload in events)


def created(n: int = 0, name: str = "response.created") -> tuple[str, dict]:
    return name, {"type": "response.created", "response": RESPONSE, "sequence_number": n}


def check_stream(body: bytes) -> None:
    request = json.dumps({"input": "x", "stream": True}).encode()
    check_response("POST", "/v1/responses", request, 200, SSE_HEADERS, body)


def test_a_conforming_named_stream_passes() -> None:
    delta = {"type": "response.output_text.delta", "item_id": "msg_1", "output_index": 0}
    delta = {**delta, "content_index": 0, "delta": "a", "logprobs": [], "sequence_number": 1}
    check_stream(sse.KEEPALIVE + named(created(), ("response.output_text.delta", delta)))


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (sse.data_frame(created()[1]), "not 'event: ' then 'data: '"),
        (named(created(name="response.completed")), "carries type 'response.created'"),
        (named(created(), created(2)), "sequence_number 2, expected 1"),
        (named(("response.created", {"type": "response.created"})), "'sequence_number'"),
        (sse.DONE, "not 'event: ' then 'data: '"),
    ],
    ids=["no event line", "name and type differ", "sequence gap", "schema", "DONE"],
)
def test_named_stream_breaches_are_caught(body: bytes, expected: str) -> None:
    with pytest.raises(ContractViolation) as err:
        check_stream(body)
    assert expected in str(err.value), str(err.value)

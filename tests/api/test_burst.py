"""A 64-client streaming burst on loopback: every request gets a full answer or
a 429, none is reset or fails (issue 6, "Targets"), with a bounded load on the
tiny model (batch 8, max_tokens 4)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxspec.conformance.httpx_checks import checking_async_client
from mlxspec.engine import AdmissionLimits, Engine
from mlxspec.http.app import create_app
from tests.conftest import LiveServer

CLIENTS = 64
BODY = {
    "prompt": "hello",
    "max_tokens": 4,
    "logit_bias": {"2": -100},
    "stream": True,
    "stream_options": {"include_usage": True},
}
QUEUE_FULL = {
    "error": {
        "message": "generation queue is full (8 requests waiting); retry later",
        "type": "resource_admission",
        "param": None,
        "code": "queue_full",
    }
}


async def burst(base: str) -> list[tuple[int, Any]]:
    """``CLIENTS`` concurrent streamed completions; each gives ``(status, result)``:
    the parsed final chunk for a 200, the error body otherwise. Transport errors
    (a reset, a timeout) propagate and fail the test."""
    limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
    async with checking_async_client(base, timeout=60, limits=limits) as client:

        async def one() -> tuple[int, Any]:
            async with client.stream("POST", "/v1/completions", json=BODY) as r:
                body = (await r.aread()).decode()
            if r.status_code != 200:
                return r.status_code, json.loads(body)
            payloads = [f[len("data: ") :] for f in body.split("\n\n") if f.startswith("data: ")]
            assert payloads[-1] == "[DONE]", body
            # the finishing chunk, with the usage of include_usage's chunk after it
            usage = json.loads(payloads[-2])["usage"]
            return 200, {**json.loads(payloads[-3]), "usage": usage}

        return await asyncio.wait_for(asyncio.gather(*(one() for _ in range(CLIENTS))), 60)


def assert_full_answer(final: dict) -> None:
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["usage"]["completion_tokens"] == 4


def test_64_clients_within_the_queue_all_complete(tiny_server: LiveServer, tiny_engine) -> None:
    done_before = tiny_engine.counters["completed"]
    results = asyncio.run(burst(tiny_server.base))
    assert [status for status, _ in results] == [200] * CLIENTS
    for _, final in results:
        assert_full_answer(final)
    assert tiny_engine.counters["completed"] - done_before == CLIENTS
    assert tiny_engine.in_flight == 0


@pytest.fixture(scope="module")
def short_queue_server(tiny_model_dir: Path) -> Iterator[tuple[LiveServer, Engine]]:
    """Batch 8 with only 8 waiting: a 64-client burst overflows it."""
    engine = Engine.load(tiny_model_dir, "tiny-llama", limits=AdmissionLimits(max_queue=8))
    engine.start()
    with LiveServer(create_app(engine, validate_responses=True)) as server:
        yield server, engine
    engine.close()


def test_burst_beyond_the_queue_gets_full_answers_or_429s(short_queue_server) -> None:
    server, engine = short_queue_server
    results = asyncio.run(burst(server.base))
    answered = [final for status, final in results if status == 200]
    refused = [body for status, body in results if status == 429]
    assert len(answered) + len(refused) == CLIENTS
    assert len(answered) >= 16  # 8 decoding plus 8 waiting always fit
    for final in answered:
        assert_full_answer(final)
    assert all(body == QUEUE_FULL for body in refused)
    assert engine.admission.rejected["queue_full"] == len(refused)
    assert engine.counters == {"completed": len(answered), "cancelled": 0, "failed": 0}
    assert engine.in_flight == 0

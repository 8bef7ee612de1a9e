"""Token fast-forwarding over HTTP (``--fill strict`` on a tiny Hermes tool
model): structured output on chat and text completions and a forced tool call
answer exactly what a server without fill answers, with ``usage.fill`` on the
response and on the final stream chunk, every response checked against the
OpenAPI document; ``/stats`` ``fill`` counts what the replies did; a request
without a grammar, and a server without fill, report none of it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fixtures.tool_models import build_tool_model
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine import Engine
from tests.conftest import LiveServer

SCHEMA = {
    "type": "object",
    "properties": {
        "temperature_unit": {"enum": ["celsius", "fahrenheit"]},
        "weather_report_location": {"type": "string", "maxLength": 5},
    },
    "required": ["temperature_unit", "weather_report_location"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}
TOOL = {
    "type": "function",
    "function": {
        "name": "get_current_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 5}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
STREAM = {"stream": True, "stream_options": {"include_usage": True}}


def _serve(folder, fill: bool) -> Iterator[httpx.Client]:
    from mlxspec.http.app import create_app

    engine = Engine.load(folder, "tiny-tools", max_batch=4 if fill else 1, fill=fill)
    engine.start()
    try:
        with LiveServer(create_app(engine, validate_responses=True)) as server:
            with checking_client(server.base, timeout=120) as c:
                yield c
    finally:
        engine.close()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return build_tool_model(tmp_path_factory.mktemp("fill-http") / "hermes", "hermes")


@pytest.fixture(scope="module")
def filled(folder) -> Iterator[httpx.Client]:
    yield from _serve(folder, True)


@pytest.fixture(scope="module")
def unfilled(folder) -> Iterator[httpx.Client]:
    yield from _serve(folder, False)


def _post(client: httpx.Client, path: str, body: dict) -> dict:
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return r.json()


def _stream(client: httpx.Client, path: str, body: dict) -> tuple[str, dict]:
    """The streamed text (content or completion text) and the final usage."""
    r = client.post(path, json={**body, **STREAM})
    assert r.status_code == 200, r.text
    frames = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(f) for f in frames[:-1]]
    text = "".join(
        (c.get("delta", {}).get("content") or "") if "delta" in c else c.get("text", "")
        for chunk in chunks
        for c in chunk["choices"]
    )
    return text, chunks[-1]["usage"]


def _fill(usage: dict) -> dict:
    fill = usage["fill"]
    assert fill["injected"] + fill["decodeSteps"] == usage["completion_tokens"]
    assert fill["strict"] == fill["injected"] > 0 and sum(fill["spanLens"]) == fill["injected"]
    assert fill["verifyAccepted"] >= fill["injected"] and fill["echo"] == 0
    return fill


def _answer(body: dict) -> Any:
    choice = body["choices"][0]
    return choice["message"] if "message" in choice else choice["text"]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/chat/completions", {"messages": ASK, "response_format": FORMAT, "max_tokens": 90}),
        ("/v1/completions", {"prompt": "Weather:", "response_format": FORMAT, "max_tokens": 90}),
    ],
)
def test_structured_output_equals_unfilled_and_reports_fill(filled, unfilled, path, body) -> None:
    before = filled.get("/stats").json()["fill"]
    want = _post(unfilled, path, body)
    got = _post(filled, path, body)
    assert _answer(got) == _answer(want)
    assert got["usage"]["completion_tokens"] == want["usage"]["completion_tokens"]
    assert "fill" not in want["usage"]
    fills = [_fill(got["usage"])]
    text, usage = _stream(filled, path, body)
    answer = _answer(want)
    assert text == (answer["content"] if isinstance(answer, dict) else answer)
    fills.append(_fill(usage))
    after = filled.get("/stats").json()["fill"]
    assert after["mode"] == "strict"
    assert after["spans"] - before["spans"] == sum(f["verifyEvents"] for f in fills)
    assert after["injected"] - before["injected"] == sum(f["verifyAccepted"] for f in fills)


def test_a_forced_tool_call_equals_unfilled(filled, unfilled) -> None:
    body = {
        "messages": ASK,
        "tools": [TOOL],
        "tool_choice": {"type": "function", "function": {"name": "get_current_weather"}},
        "max_tokens": 120,
    }
    want, got = (
        _post(unfilled, "/v1/chat/completions", body),
        _post(filled, "/v1/chat/completions", body),
    )
    calls = [c["function"] for c in got["choices"][0]["message"]["tool_calls"]]
    assert calls == [c["function"] for c in want["choices"][0]["message"]["tool_calls"]]
    assert calls[0]["name"] == "get_current_weather"
    assert _fill(got["usage"])["injected"] >= len('{"name": "get_current_weather"') // 2


def test_requests_without_a_grammar_and_servers_without_fill_report_none(filled, unfilled) -> None:
    body = {"messages": ASK, "max_tokens": 6}
    assert "fill" not in _post(filled, "/v1/chat/completions", body)["usage"]
    assert "fill" not in unfilled.get("/stats").json()

"""The speculation surface over HTTP (``--draft-kind ngram`` on the tiny
model): ``usage.speculation`` and ``usage.lane`` on chat and text completions,
non-streaming and on the final stream chunk, every response checked against the
OpenAPI document; ``/stats`` ``speculation`` counts what the replies reported;
``/metrics`` has the acceptance histogram; a server without a draft source
reports none of it."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine import Engine, SpeculationOptions
from tests.conftest import LiveServer

PROMPT = "one two three four one two three four one two three four one two"


@pytest.fixture(scope="module")
def spec_client(tiny_model_dir) -> Iterator[httpx.Client]:
    from mlxspec.http.app import create_app

    engine = Engine.load(
        tiny_model_dir, "tiny-llama", max_batch=4, speculation=SpeculationOptions("ngram", 4)
    )
    engine.start()
    try:
        with LiveServer(create_app(engine, validate_responses=True)) as server:
            with checking_client(server.base, timeout=60) as c:
                yield c
    finally:
        engine.close()


def _stream_usage(r: httpx.Response) -> dict:
    frames = [line[6:] for line in r.text.splitlines() if line.startswith("data: ")]
    assert frames[-1] == "[DONE]"
    return json.loads(frames[-2])["usage"]


def _check(usage: dict) -> dict:
    spec = usage["speculation"]
    assert usage["lane"] == "batched"
    assert 0 < spec["accepted"] <= spec["drafted"]
    assert spec["targetCalls"] + spec["accepted"] == usage["completion_tokens"]  # length-ended
    return spec


def test_chat_and_text_completions_report_speculation(spec_client) -> None:
    before = spec_client.get("/stats").json()["speculation"]
    chat = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 20}
    seen = []
    r = spec_client.post("/v1/chat/completions", json=chat)
    assert r.status_code == 200, r.text
    seen.append(_check(r.json()["usage"]))
    stream = {**chat, "stream": True, "stream_options": {"include_usage": True}}
    r = spec_client.post("/v1/chat/completions", json=stream)
    seen.append(_check(_stream_usage(r)))
    text = {"prompt": PROMPT, "max_tokens": 16}
    r = spec_client.post("/v1/completions", json=text)
    assert r.status_code == 200, r.text
    seen.append(_check(r.json()["usage"]))
    asked = {"stream": True, "stream_options": {"include_usage": True}}
    r = spec_client.post("/v1/completions", json={**text, **asked})
    seen.append(_check(_stream_usage(r)))
    after = spec_client.get("/stats").json()["speculation"]
    assert after["kind"] == "ngram" and after["num_draft_tokens"] == 4
    assert after["accepted"] - before["accepted"] == sum(s["accepted"] for s in seen)
    assert after["drafted"] - before["drafted"] == sum(s["drafted"] for s in seen)
    assert sum(after["accepted_histogram"]) > sum(before["accepted_histogram"])
    assert after["acceptance_rate"] == round(after["accepted"] / after["drafted"], 4)


def test_requests_that_cannot_speculate_omit_the_field(spec_client) -> None:
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 8,
        "frequency_penalty": 0.5,
    }
    r = spec_client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert "speculation" not in r.json()["usage"]


def test_metrics_have_the_acceptance_histogram(spec_client) -> None:
    spec_client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 12})
    stats = spec_client.get("/stats").json()["speculation"]
    text = spec_client.get("/metrics").text
    assert f"mlxspec_speculation_accepted_tokens_total {float(stats['accepted'])}" in text
    count = sum(stats["accepted_histogram"])
    assert f'mlxspec_speculation_accepted_per_verify_bucket{{le="+Inf"}} {float(count)}' in text
    assert f"mlxspec_speculation_accepted_per_verify_count {float(count)}" in text


def test_without_a_draft_source_nothing_is_reported(client) -> None:
    r = client.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 6})
    assert "speculation" not in r.json()["usage"]
    assert "speculation" not in client.get("/stats").json()
    assert "mlxspec_speculation" not in client.get("/metrics").text

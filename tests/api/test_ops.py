"""Operations: API keys (401 per surface), CORS, /metrics, /stats and /fit."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from mlxspec.cli.flags import parse_bytes, parse_config
from mlxspec.config import ServeConfig
from mlxspec.conformance.asgi import chat_post_scope
from mlxspec.conformance.httpx_checks import checking_async_client
from mlxspec.http.app import create_app
from mlxspec.openapi import load_spec

KEY = "sk-local-0123456789"
NO_EOS = {"2": -100}
COMPLETION = {"prompt": "hello", "max_tokens": 3, "logit_bias": NO_EOS}


def call(app: Any, go: Callable[[httpx.AsyncClient], Awaitable[Any]], check: bool = True) -> Any:
    """Run ``go(client)`` against ``app`` in-process; the client checks every
    response against the document unless ``check`` is False."""

    async def run() -> Any:
        transport = httpx.ASGITransport(app=app)
        make = checking_async_client if check else httpx.AsyncClient
        async with make(base_url="http://localhost", transport=transport, timeout=60) as c:
            return await go(c)

    return asyncio.run(run())


@pytest.fixture(scope="module")
def keyed_app(tiny_engine: Any) -> Any:
    return create_app(tiny_engine, ServeConfig(api_key=KEY), validate_responses=True)


# -------------------------------------------------------------- API keys


def unauthorized(message: str) -> dict:
    return {
        "error": {
            "message": message,
            "type": "authentication_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/v1/completions", {"prompt": "hi"}),
        ("POST", "/v1/responses", {"input": "hi"}),
        ("GET", "/v1/responses/resp_1", None),
        ("DELETE", "/v1/responses/resp_1", None),
        ("GET", "/v1/models", None),
        ("GET", "/v1", None),
        ("GET", "/stats", None),
        ("GET", "/metrics", None),
    ],
)
def test_missing_or_wrong_key_is_401(keyed_app: Any, method: str, path: str, body: Any) -> None:
    async def go(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [
            await c.request(method, path, json=body),
            await c.request(method, path, json=body, headers={"Authorization": "Bearer nope"}),
            await c.request(method, path, json=body, headers={"x-api-key": "nope"}),
        ]

    missing, wrong_bearer, wrong_header = call(keyed_app, go)
    assert (missing.status_code, missing.json()) == (
        401,
        unauthorized("No authorization token provided"),
    )
    for r in (wrong_bearer, wrong_header):
        assert (r.status_code, r.json()) == (401, unauthorized("invalid API key"))
    assert missing.headers["www-authenticate"] == "Bearer"


def test_schema_errors_are_not_shown_before_authentication(keyed_app: Any) -> None:
    r = call(keyed_app, lambda c: c.post("/v1/completions", json={"prompt": 5}))
    assert r.status_code == 401


@pytest.mark.skipif("/v1/messages" not in load_spec()["paths"], reason="no Messages surface yet")
def test_401_on_messages_is_anthropic_shaped(keyed_app: Any) -> None:
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    r = call(keyed_app, lambda c: c.post("/v1/messages", json=body, headers={"x-api-key": "no"}))
    assert (r.status_code, r.json()) == (
        401,
        {"type": "error", "error": {"type": "authentication_error", "message": "invalid API key"}},
    )


def test_bearer_and_x_api_key_are_accepted(keyed_app: Any) -> None:
    async def go(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [
            await c.post("/v1/completions", json=COMPLETION, headers={"x-api-key": KEY}),
            await c.post(
                "/v1/completions", json=COMPLETION, headers={"Authorization": f"bearer {KEY}"}
            ),
            await c.get(
                "/v1/models", headers={"x-api-key": "wrong", "Authorization": f"Bearer {KEY}"}
            ),
        ]

    assert [r.status_code for r in call(keyed_app, go)] == [200, 200, 200]


def test_health_and_the_document_need_no_key(keyed_app: Any) -> None:
    async def go(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [await c.get("/health"), await c.get("/openapi.json")]

    health, document = call(keyed_app, go)
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert document.status_code == 200
    # A keyed server's document drops the optional ({}) alternative.
    assert document.json()["security"] == [{"bearerAuth": []}, {"apiKeyAuth": []}]
    assert load_spec()["security"] == [{"bearerAuth": []}, {"apiKeyAuth": []}, {}]
    assert document.json()["paths"]["/health"]["get"]["security"] == []


def test_openai_sdk_authenticates_with_the_key(keyed_app: Any) -> None:
    async def go(api_key: str) -> Any:
        transport = httpx.ASGITransport(app=keyed_app)
        async with checking_async_client(transport=transport, timeout=60) as http:
            client = openai.AsyncOpenAI(
                base_url="http://localhost/v1", api_key=api_key, http_client=http
            )
            return await client.completions.create(model="m", **COMPLETION)

    assert asyncio.run(go(KEY)).usage.completion_tokens == 3
    with pytest.raises(openai.AuthenticationError) as err:
        asyncio.run(go("wrong"))
    assert err.value.status_code == 401
    assert err.value.body == unauthorized("invalid API key")["error"]


def test_an_open_server_ignores_credentials(tiny_app: Any) -> None:
    r = call(tiny_app, lambda c: c.get("/v1/models", headers={"Authorization": "Bearer x"}))
    assert r.status_code == 200


def test_api_key_from_flag_or_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_config(["serve", "--api-key", "k1"]).api_key == "k1"
    monkeypatch.setenv("MLXSPEC_API_KEY", "k2")
    config = parse_config(["serve"])
    assert config.api_key == "k2"
    assert "k2" not in repr(config)
    assert parse_config(["serve", "--api-key", "k3"]).api_key == "k3"


def test_operations_flags() -> None:
    config = parse_config(
        [
            "serve",
            "--max-queue",
            "0",
            "--max-context",
            "4096",
            "--memory-budget",
            "1.5GiB",
            "--allowed-origins",
            "http://a.example, http://b.example",
            "--allowed-origins",
            "*",
        ]
    )
    assert (config.max_queue, config.max_context, config.memory_budget) == (0, 4096, 3 * 2**29)
    assert config.allowed_origins == ("http://a.example", "http://b.example", "*")
    assert [parse_bytes(t) for t in ("512", "2k", "3MB", "1 gib", "1T")] == [
        512,
        2048,
        3 * 2**20,
        2**30,
        2**40,
    ]
    for bad in (["--memory-budget", "lots"], ["--memory-budget", "0"], ["--max-queue", "-1"]):
        with pytest.raises(SystemExit):
            parse_config(["serve", *bad])


# ------------------------------------------------------------------ CORS

PREFLIGHT = {
    "Origin": "http://ui.example",
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}


def test_cors_preflight_with_allowed_origins(tiny_engine: Any) -> None:
    config = ServeConfig(api_key=KEY, allowed_origins=("http://ui.example",))
    app = create_app(tiny_engine, config)

    async def go(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [
            await c.options("/v1/chat/completions", headers=PREFLIGHT),
            await c.options("/v1/chat/completions", headers={**PREFLIGHT, "Origin": "http://evil"}),
            await c.get("/health", headers={"Origin": "http://ui.example"}),
        ]

    preflight, other, simple = call(app, go, check=False)
    assert preflight.status_code == 200  # answered before the key is checked
    assert preflight.headers["access-control-allow-origin"] == "http://ui.example"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert preflight.headers["access-control-allow-headers"] == "authorization, content-type"
    assert other.status_code == 400
    assert "access-control-allow-origin" not in other.headers
    assert simple.headers["access-control-allow-origin"] == "http://ui.example"


def refused(message: str) -> dict:
    return {
        "error": {
            "message": f"CORS preflight refused: {message}",
            "type": "invalid_request_error",
            "param": None,
            "code": "cors_refused",
        }
    }


def test_a_refused_preflight_is_a_json_error_in_the_surface_envelope(tiny_engine: Any) -> None:
    app = create_app(tiny_engine, ServeConfig(api_key=KEY, allowed_origins=("http://ui.example",)))
    evil = {**PREFLIGHT, "Origin": "http://evil"}

    async def go(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [
            await c.options("/v1/chat/completions", headers=evil),
            await c.options(
                "/v1/models", headers={**PREFLIGHT, "Access-Control-Request-Method": "PUT"}
            ),
            await c.options(
                "/v1/chat/completions", headers={**evil, "Access-Control-Request-Method": "PUT"}
            ),
            await c.options("/v1/messages", headers=evil),
            await c.options("/v1/systemone", headers=evil),
            await c.options("/v1/chat/completions", headers=PREFLIGHT),
        ]

    origin, method, both, messages, systemone, allowed = call(app, go, check=False)
    for r in (origin, method, both, messages, systemone):
        assert r.status_code == 400
        assert r.headers["content-type"] == "application/json"
        # the browser still blocks: no allowed origin, or the method is not listed
        assert ("access-control-allow-origin" in r.headers) is (r is method)
    assert "PUT" not in method.headers["access-control-allow-methods"]
    assert origin.json() == refused("origin 'http://evil' is not allowed")
    assert method.json() == refused("method 'PUT' is not allowed")
    assert both.json() == refused("origin 'http://evil', method 'PUT' are not allowed")
    assert messages.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "CORS preflight refused: origin 'http://evil' is not allowed",
        },
    }
    # not a validation error: /v1/systemone keeps the OpenAI envelope and the 400
    assert systemone.json() == refused("origin 'http://evil' is not allowed")
    # an allowed preflight is still Starlette's
    assert (allowed.status_code, allowed.text) == (200, "OK")
    assert allowed.headers["access-control-allow-origin"] == "http://ui.example"


def test_no_cors_headers_without_allowed_origins(tiny_app: Any) -> None:
    async def go(c: httpx.AsyncClient) -> list[httpx.Response]:
        return [
            await c.options("/v1/chat/completions", headers=PREFLIGHT),
            await c.get("/health", headers={"Origin": "http://ui.example"}),
        ]

    preflight, simple = call(tiny_app, go)
    assert preflight.status_code == 405
    for r in (preflight, simple):
        assert not any(k.startswith("access-control-") for k in r.headers)


# --------------------------------------------------------------- metrics


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of an exposition."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_metrics_move_after_requests(tiny_engine: Any) -> None:
    app = create_app(tiny_engine, validate_responses=True)
    n = len(tiny_engine.text_prompt(COMPLETION["prompt"]))

    cached: list[int] = []

    async def go(c: httpx.AsyncClient) -> tuple[dict, dict]:
        before = samples((await c.get("/metrics")).text)
        plain = await c.post("/v1/completions", json=COMPLETION)
        assert plain.status_code == 200
        cached.append(plain.json()["usage"]["prompt_tokens_details"]["cached_tokens"])
        asked = {"stream": True, "stream_options": {"include_usage": True}}
        streamed = await c.post("/v1/completions", json={**COMPLETION, **asked})
        assert streamed.status_code == 200
        last = json.loads(streamed.text.split("data: ")[-2])
        cached.append(last["usage"]["prompt_tokens_details"]["cached_tokens"])
        await c.get("/v1/models/nope")
        response = await c.get("/metrics")
        assert response.headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        return before, samples(response.text)

    before, after = call(app, go)
    assert cached[1] == n - 1  # the repeat reuses all but the last prompt token
    post = ("method", "POST"), ("route", "/v1/completions"), ("status", "200")
    assert after[("mlxspec_http_requests_total", post)] == 2
    miss = ("method", "GET"), ("route", "/v1/models/{model_id}"), ("status", "404")
    assert after[("mlxspec_http_requests_total", miss)] == 1
    scrape = ("method", "GET"), ("route", "/metrics"), ("status", "200")
    assert after[("mlxspec_http_requests_total", scrape)] == 1  # the first scrape
    assert after[("mlxspec_prompt_tokens_total", ())] == 2 * n
    assert after[("mlxspec_generation_tokens_total", ())] == 6
    assert after[("mlxspec_time_to_first_token_seconds_count", ())] == 2
    # TTFT splits into queue and prefill time, each request once, at most TTFT together
    assert after[("mlxspec_request_queue_time_seconds_count", ())] == 2
    assert after[("mlxspec_request_prefill_time_seconds_count", ())] == 2
    split = after[("mlxspec_request_queue_time_seconds_sum", ())]
    split += after[("mlxspec_request_prefill_time_seconds_sum", ())]
    assert 0 < split <= after[("mlxspec_time_to_first_token_seconds_sum", ())]
    assert after[("mlxspec_inter_token_latency_seconds_count", ())] == 4  # 2 gaps each
    hits = ("mlxspec_prompt_cache_hits_total", ())
    assert after[hits] - before.get(hits, 0) == sum(1 for c in cached if c > 0)
    hit_tokens = ("mlxspec_prompt_cache_tokens_total", ())
    assert after[hit_tokens] - before.get(hit_tokens, 0) == sum(cached)
    done = ("mlxspec_generations_total", (("outcome", "completed"),))
    assert after[done] - before[done] == 2
    assert after[("mlxspec_queue_depth", ())] == 0
    assert after[("mlxspec_active_rows", ())] == 0
    assert before[("mlxspec_time_to_first_token_seconds_count", ())] == 0


def test_each_app_has_its_own_registry(tiny_engine: Any) -> None:
    first, second = create_app(tiny_engine), create_app(tiny_engine)
    call(first, lambda c: c.get("/health"))
    text = call(second, lambda c: c.get("/metrics")).text
    assert 'route="/health"' not in text


# ----------------------------------------------------------- /stats, /fit


def test_stats_counters_move(tiny_engine: Any, tiny_app: Any) -> None:
    async def go(c: httpx.AsyncClient) -> tuple[dict, dict]:
        before = (await c.get("/stats")).json()
        assert (await c.post("/v1/completions", json=COMPLETION)).status_code == 200
        return before, (await c.get("/stats")).json()

    before, after = call(tiny_app, go)
    assert after["requests"]["submitted"] == before["requests"]["submitted"] + 1
    assert after["requests"]["completed"] == before["requests"]["completed"] + 1
    assert after["batch"]["submitted_rows"] == after["requests"]["submitted"]
    assert after["server"] | {"uptime_s": 0} == {
        "owner": "serve",
        "version": "0.1.0",
        "model": "tiny-llama",
        "started_at": tiny_engine.info.created,
        "uptime_s": 0,
    }
    assert after["batch"] | {"submitted_rows": 0, "steps": None, "solo_steps": None} == {
        "configured": 8,
        "mode": "batch",
        "batched": True,
        "active_rows": 0,
        "pending_rows": 0,
        "submitted_rows": 0,
        "kv_bytes": 0,  # nothing runs once the completion has ended
        "kv_budget_bytes": None,
        "steps": None,
        "solo_steps": None,
    }
    assert after["kv_quant"] == {
        "mode": "bf16",  # the reference's name for no KV quantisation
        "layers": {"bf16": 2},
        "attention": {"global": 2, "sliding_window": 0},
        "recurrent_layers": 0,
        "dtype": "float32",
        "group_size": None,
        "quantized_kv_start": None,
        "bytes_per_token": 2 * 2 * 2 * 16 * 4,  # layers x KV heads x (K, V) x head dim x 4
    }
    assert after["admission"]["enforced_context_tokens"] is None
    assert after["admission"]["weights_bytes"] == tiny_weight_bytes(tiny_engine)


def test_stats_step_times_count_the_batched_steps(tiny_engine: Any, tiny_app: Any) -> None:
    body = {"prompt": "hello", "max_tokens": 6, "logit_bias": NO_EOS}

    async def go(c: httpx.AsyncClient) -> tuple[dict, list, dict]:
        before = (await c.get("/stats")).json()["batch"]["steps"]
        answers = await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(3)))
        return before, answers, (await c.get("/stats")).json()["batch"]["steps"]

    before, answers, after = call(tiny_app, go)
    assert [a.json()["usage"]["completion_tokens"] for a in answers] == [6, 6, 6]
    # At most one of the three decodes alone (before the others arrive) and is handed
    # to the batch, so at least two run their 6 tokens there: 12 to 18 tokens routed.
    rows = after["mean_rows"] * after["steps"] - before["mean_rows"] * before["steps"]
    assert 12 <= round(rows) <= 18
    assert after["steps"] - before["steps"] >= 6
    assert after["generate_ms_mean"] > 0 and after["route_ms_mean"] > 0


def test_stats_solo_steps_count_a_lone_requests_decode_steps(tiny_app: Any) -> None:
    body = {"prompt": "hello", "max_tokens": 5, "logit_bias": NO_EOS}

    async def go(c: httpx.AsyncClient) -> tuple[dict, dict, dict]:
        before = (await c.get("/stats")).json()["batch"]
        answer = (await c.post("/v1/completions", json=body)).json()
        return before, answer, (await c.get("/stats")).json()["batch"]

    before, answer, after = call(tiny_app, go)
    assert answer["usage"]["completion_tokens"] == 5
    # alone, the request decodes on generate_step: one step per token, none batched
    assert after["solo_steps"]["steps"] - before["solo_steps"]["steps"] == 5
    assert after["steps"]["steps"] == before["steps"]["steps"]
    assert after["solo_steps"]["mean_rows"] == 1.0
    assert after["solo_steps"]["generate_ms_mean"] > 0 and after["solo_steps"]["route_ms_mean"] > 0


def test_step_times_snapshot_is_per_step_means_in_milliseconds() -> None:
    from mlxspec.engine.loop.batching import StepTimes

    assert StepTimes().snapshot() == {
        "steps": 0,
        "mean_rows": 0.0,
        "generate_ms_mean": 0.0,
        "route_ms_mean": 0.0,
    }
    times = StepTimes(steps=4, rows=10, generate_s=0.2, route_s=0.004)
    assert times.snapshot() == pytest.approx(
        {"steps": 4, "mean_rows": 2.5, "generate_ms_mean": 50.0, "route_ms_mean": 1.0}
    )


def tiny_weight_bytes(engine: Any) -> int:
    from mlx.utils import tree_flatten

    return sum(v.nbytes for _, v in tree_flatten(engine.model.parameters()))


def test_stats_shows_reports_of_present_components(tiny_engine: Any) -> None:
    # every app has a Responses store (mlxspec/handlers/responses/store.py); a fresh one is empty
    app = create_app(tiny_engine, validate_responses=True)
    body = call(app, lambda c: c.get("/stats")).json()
    assert body["response_store"] == {
        "entries": 0,
        "bytes": 0,
        "max_bytes": 32 * 1024 * 1024,
        "ttl_ms": 3_600_000,
    }


def test_fit_is_sane(tiny_engine: Any, tiny_app: Any) -> None:
    fit = call(tiny_app, lambda c: c.get("/fit")).json()
    report = fit["report"]
    # 2 layers x 2 KV heads x head_dim 16 (64 / 4 heads) x K and V x 4 bytes (float32)
    assert report["kv_bytes_per_token"] == 2 * 2 * 16 * 2 * 4
    assert report["weights_bytes"] == tiny_weight_bytes(tiny_engine)
    assert fit["context_tokens"] == report["max_safe_context"] == 256  # the window binds
    assert fit["typical_context_tokens"] == 256
    assert report["kv_bytes"] == 256 * report["kv_bytes_per_token"]
    assert report["transient_bytes"] == int(report["usable_bytes"] * 0.1)
    assert report["total_bytes"] == (
        report["weights_bytes"] + report["kv_bytes"] + report["transient_bytes"]
    )
    assert report["fits"] is True
    machine = fit["machine"]
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    assert machine["ram_bytes"] == int(meminfo["MemTotal"].split()[0]) * 1024
    cpuinfo = Path("/proc/cpuinfo").read_text()
    assert machine["cpu"] in cpuinfo and machine["cpu_count"] >= 1
    assert 0.1 < machine["bandwidth_gbs"] < 10_000
    assert (machine["gpu"], fit["device"]) == (None, "cpu")
    per_token = report["weights_bytes"] + report["kv_bytes_per_token"] * 256
    expected = machine["bandwidth_gbs"] * 1e9 / per_token
    assert report["predicted_decode_tps"] == pytest.approx(expected, rel=0.01)
    assert fit["typical_decode_tps"] == report["predicted_decode_tps"]


def test_fit_on_a_gpu_uses_the_gpus_bandwidth_measured_on_the_engine_thread(
    tiny_engine: Any, tiny_app: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from mlxspec.host import machine

    threads = []

    def probe() -> float:
        threads.append(threading.current_thread().name)
        return 4000.0

    fake = machine.Gpu("NVIDIA H200", 150_000_000_000, 140_000_000_000)
    monkeypatch.setattr(machine, "gpu", lambda: fake)
    monkeypatch.setattr(machine, "device_bandwidth_gbs", probe)
    fit = call(tiny_app, lambda c: c.get("/fit")).json()
    assert threads == ["mlxspec-engine"]  # where MLX work runs, never the event loop
    assert fit["device"] == "gpu"
    assert fit["machine"]["gpu"] == {
        "name": "NVIDIA H200",
        "memory_bytes": 150_000_000_000,
        "free_bytes": 140_000_000_000,
    }
    assert fit["machine"]["bandwidth_gbs"] == 4000.0
    assert fit["machine"]["bandwidth_source"] == "device memory copy (MLX on the GPU)"
    report = fit["report"]
    per_token = report["weights_bytes"] + report["kv_bytes_per_token"] * 256
    assert report["predicted_decode_tps"] == round(4000.0e9 / per_token, 2)


def test_the_device_bandwidth_probe_measures_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlxspec.host import machine

    monkeypatch.setattr(machine, "DEVICE_PROBE_BYTES", 16 * 2**20)  # small on this CPU
    machine.device_bandwidth_gbs.cache_clear()
    try:
        first = machine.device_bandwidth_gbs()
        assert 0.1 < first < 100_000
        assert machine.device_bandwidth_gbs() == first  # cached: measured once
    finally:
        machine.device_bandwidth_gbs.cache_clear()


def test_document_declares_the_operations_routes() -> None:
    spec = load_spec()
    for path, op in (("/stats", "getStats"), ("/fit", "getFit"), ("/metrics", "getMetrics")):
        assert spec["paths"][path]["get"]["operationId"] == op
    schemes = spec["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {**schemes["bearerAuth"], "type": "http", "scheme": "bearer"}
    assert (schemes["apiKeyAuth"]["in"], schemes["apiKeyAuth"]["name"]) == ("header", "x-api-key")


def test_route_labels_follow_the_document() -> None:
    from mlxspec.http.metrics import RouteLabels

    label = RouteLabels(load_spec())
    assert label("/v1/models/HuggingFaceTB/SmolLM2-135M-Instruct") == "/v1/models/{model_id}"
    assert label("/v1/models") == "/v1/models"
    assert label("/openapi.json") == "/openapi.json"
    assert label("/v1/models/") == "unmatched"
    assert label("/wp-admin") == "unmatched"


def test_generation_watch_splits_a_multi_token_gap() -> None:
    import time

    from mlxspec.engine import Delta, Finished
    from mlxspec.http.metrics import GenerationWatch, Metrics

    metrics = Metrics(engine=None)
    watch = GenerationWatch(metrics, start=time.monotonic() - 2.0)
    watch.observe(Delta("ab", (5, 6)))  # the first token (TTFT ~2 s) and one with it
    watch.observe(Delta("", ()))  # a text-only flush carries no token
    watch.observe(Delta("cd", (7, 8)))  # two tokens share one gap
    watch.observe(Finished("length", prompt_tokens=7, completion_tokens=2, cached_tokens=3))
    got = samples(metrics.render().decode())
    assert got[("mlxspec_time_to_first_token_seconds_count", ())] == 1
    # no handle: no split of the TTFT
    assert got[("mlxspec_request_queue_time_seconds_count", ())] == 0
    assert got[("mlxspec_time_to_first_token_seconds_bucket", (("le", "1.0"),))] == 0
    assert got[("mlxspec_time_to_first_token_seconds_bucket", (("le", "2.5"),))] == 1
    assert got[("mlxspec_inter_token_latency_seconds_count", ())] == 2
    assert got[("mlxspec_inter_token_latency_seconds_bucket", (("le", "0.5"),))] == 2
    assert got[("mlxspec_prompt_tokens_total", ())] == 7
    assert got[("mlxspec_generation_tokens_total", ())] == 2
    assert got[("mlxspec_prompt_cache_hits_total", ())] == 1
    assert got[("mlxspec_prompt_cache_tokens_total", ())] == 3
    assert got[("mlxspec_queue_depth", ())] == 0  # an engine without admission state


def test_generation_watch_splits_ttft_at_the_start() -> None:
    import time
    from types import SimpleNamespace

    from mlxspec.engine import Delta
    from mlxspec.http.metrics import GenerationWatch, Metrics

    metrics = Metrics(engine=None)
    now = time.monotonic()
    handle = SimpleNamespace(started_at=now - 0.3)  # waited ~0.7 s, then 0.3 s to the token
    watch = GenerationWatch(metrics, now - 1.0, handle)
    watch.observe(Delta("a", (5,)))
    watch.observe(Delta("b", (6,)))  # later tokens add no queue or prefill sample
    got = samples(metrics.render().decode())
    queue = got[("mlxspec_request_queue_time_seconds_sum", ())]
    prefill = got[("mlxspec_request_prefill_time_seconds_sum", ())]
    assert got[("mlxspec_request_queue_time_seconds_count", ())] == 1
    assert 0.69 < queue < 0.71
    assert 0.3 <= prefill < 0.5
    assert got[("mlxspec_request_prefill_time_seconds_bucket", (("le", "0.25"),))] == 0
    assert got[("mlxspec_request_queue_time_seconds_bucket", (("le", "1.0"),))] == 1


def test_machine_reads_proc_files(tmp_path: Path) -> None:
    from mlxspec.host import machine

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nBogoMIPS\t: 50.00\nModel\t\t: Raspberry Pi 5 Model B\n")
    assert machine.cpu_model(cpuinfo) == "Raspberry Pi 5 Model B"
    assert machine.cpu_model(tmp_path / "missing") is None
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384 kB\nMemFree:  1 kB\nMemAvailable:    8192 kB\n")
    assert machine.memory(meminfo) == (16384 * 1024, 8192 * 1024)


# ----------------------------------------------------------- body size cap


def test_oversized_body_is_413_unread_in_each_surface_shape(tiny_engine: Any) -> None:
    from mlxspec.conformance.httpx_checks import checking_client
    from tests.conftest import LiveServer

    cap = 100_000
    app = create_app(tiny_engine, ServeConfig(max_body_bytes=cap), validate_responses=True)

    def body(chars: int) -> dict:
        return {"messages": [{"role": "user", "content": "x" * chars}], "max_tokens": 1}

    message = f"request body exceeds {cap} bytes"
    with LiveServer(app) as server, checking_client(server.base, timeout=60) as c:
        r = c.post("/v1/chat/completions", json=body(150_000))
        assert r.status_code == 413
        assert r.json() == {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": "payload_too_large",
            }
        }
        r = c.post("/v1/messages", json=body(150_000))
        assert r.status_code == 413
        assert r.json() == {
            "type": "error",
            "error": {"type": "request_too_large", "message": message},
        }
        # under the cap (uvicorn delivers it in several chunks) it is read whole:
        # the prompt is then too long for the tiny model's 256-token window
        r = c.post("/v1/chat/completions", json=body(90_000))
        assert r.status_code == 400
        assert r.json()["error"]["code"] == "context_length_exceeded"
        assert c.get("/health").json() == {"status": "ok"}


def _raw_post(app: Any, declared: int, receive: Any) -> list[dict]:
    """Call ``app`` with one ``POST /v1/chat/completions`` declaring a body of
    ``declared`` bytes, read through ``receive``; the messages it sent."""
    scope = chat_post_scope(declared)
    sent: list[dict] = []

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(asyncio.wait_for(app(scope, receive, send), 30))
    return sent


def test_a_declared_length_over_the_cap_is_413_before_any_byte_is_read(tiny_engine: Any) -> None:
    app = create_app(tiny_engine, ServeConfig(max_body_bytes=1000))
    reads: list[int] = []

    async def receive() -> dict:
        reads.append(1)
        await asyncio.sleep(3600)  # the body never comes
        return {}

    sent = _raw_post(app, 999999999999, receive)
    assert reads == []
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"]["message"] == "request body exceeds 1000 bytes"


def test_a_body_that_stops_arriving_is_408_and_closes(tiny_engine: Any, monkeypatch) -> None:
    import mlxspec.http.app

    monkeypatch.setattr(mlxspec.http.app, "BODY_IDLE_TIMEOUT_S", 0.2)
    app = create_app(tiny_engine)
    parts = [{"type": "http.request", "body": b'{"messages": [', "more_body": True}]

    async def receive() -> dict:
        if parts:
            return parts.pop()
        await asyncio.sleep(3600)  # a slow client: the rest never comes
        return {}

    sent = _raw_post(app, 100, receive)
    assert sent[0]["status"] == 408
    assert (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"]) == {
        "error": {
            "message": "the request body arrived too slowly: it may pause for at most 0.2 s "
            "and must average 1000 bytes/s after that",
            "type": "invalid_request_error",
            "param": None,
            "code": "request_timeout",
        }
    }


def test_a_body_trickling_under_the_minimum_rate_is_408(tiny_engine: Any, monkeypatch) -> None:
    import mlxspec.http.app

    monkeypatch.setattr(mlxspec.http.app, "BODY_IDLE_TIMEOUT_S", 0.3)
    app = create_app(tiny_engine)
    got: list[float] = []

    async def receive() -> dict:  # a byte every 0.1 s: never idle for 0.3 s
        await asyncio.sleep(0.1)
        got.append(asyncio.get_running_loop().time())
        return {"type": "http.request", "body": b" ", "more_body": True}

    sent = _raw_post(app, 100_000, receive)
    assert sent[0]["status"] == 408
    assert 2 <= len(got) <= 5  # cut at ~0.3 s (+ 1 ms per byte), not held for the body


def test_max_body_bytes_flag() -> None:
    assert parse_config(["serve"]).max_body_bytes == 16 * 2**20
    assert parse_config(["serve", "--max-body-bytes", "2M"]).max_body_bytes == 2 * 2**20

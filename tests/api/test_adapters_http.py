"""LoRA adapters over HTTP on the tiny random model: mount, list, use, stack,
unmount; unknown ids on every surface; mixed-adapter batches; mounting under
load; the prompt cache per adapter. Every response is checked against the document."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fixtures.random_adapters import make_random_adapter
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine import Delta, Finished, GenerationRequest, LogitsParams
from tests.conftest import LiveServer

#: Bans EOS (token 2 of the tiny tokenizer) so every request runs its whole budget.
NO_EOS = LogitsParams(logit_bias=((2, -1e9),))
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 8}


@pytest.fixture(scope="module")
def adapter_dirs(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Random adapters for the tiny model: ``a`` and ``b`` (last block, other seeds),
    ``a2`` (other weights for id ``a``), ``ab`` (``a`` and ``b`` as one rank-8
    adapter) and ``alien`` (trained on another model by its config)."""
    root = tmp_path_factory.mktemp("adapters")
    make_random_adapter(tiny_model_dir, root / "a", seed=1, num_layers=2, std=0.2)
    make_random_adapter(tiny_model_dir, root / "b", seed=2, num_layers=1, std=0.2)
    make_random_adapter(tiny_model_dir, root / "a2", seed=3, num_layers=2, std=0.2)
    make_random_adapter(tiny_model_dir, root / "alien", base_model="org/Other-Model")
    _merge(root / "a", root / "b", root / "ab")
    return root


def _merge(first: Path, second: Path, out: Path) -> None:
    """One adapter whose residual is ``first``'s plus ``second``'s: ranks side by
    side, each ``lora_b`` scaled by its own scale (the merged scale is 1)."""
    import mlx.core as mx

    a, b = (
        mx.load(str(first / "adapters.safetensors")),
        mx.load(str(second / "adapters.safetensors")),
    )
    ca = json.loads((first / "adapter_config.json").read_text())
    cb = json.loads((second / "adapter_config.json").read_text())
    sa, sb = ca["lora_parameters"]["scale"], cb["lora_parameters"]["scale"]
    merged = {}
    for name in a:
        layer, leaf = name.rsplit(".", 1)
        if f"{layer}.lora_a" not in b:  # only in the first: pad the rank with zeros
            other = mx.zeros_like(a[name])
        else:
            other = b[name]
        if leaf == "lora_a":
            merged[name] = mx.concatenate([a[name], other], axis=1)
        else:
            merged[name] = mx.concatenate([sa * a[name], sb * other], axis=0)
    out.mkdir()
    mx.save_safetensors(str(out / "adapters.safetensors"), merged)
    config = {**ca, "lora_parameters": {**ca["lora_parameters"], "rank": 8, "scale": 1.0}}
    (out / "adapter_config.json").write_text(json.dumps(config))


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[object]:
    """An engine of this module's own (adapters mounted here stay here)."""
    from mlxspec.engine import Engine

    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=8)
    engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(engine: object) -> Iterator[LiveServer]:
    from mlxspec.http.app import create_app

    with LiveServer(create_app(engine, validate_responses=True)) as live:
        yield live


@pytest.fixture()
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with checking_client(server.base, timeout=120) as c:
        yield c


@pytest.fixture(autouse=True)
def nothing_mounted(engine: object) -> Iterator[None]:
    yield
    for adapter_id in engine.adapters.ids():
        asyncio.run(engine.run_exclusive(lambda i=adapter_id: engine.adapters.unmount(i)))


def mount(http: httpx.Client, adapter_id: str, path: Path) -> dict:
    r = http.post("/v1/adapters", json={"id": adapter_id, "path": str(path)})
    assert r.status_code == 200, r.text
    return r.json()


def chat(http: httpx.Client, **extra: object) -> str:
    r = http.post("/v1/chat/completions", json={**CHAT, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_mount_list_use_stack_unmount(http: httpx.Client, adapter_dirs: Path) -> None:
    base = chat(http)
    mounted = mount(http, "a", adapter_dirs / "a")
    assert mounted["mounted_layers"] == 14 and mounted["rank"] == 4
    assert mounted["ram_bytes"] > 0
    mount(http, "b", adapter_dirs / "b")
    mount(http, "ab", adapter_dirs / "ab")
    listed = {row["id"]: row for row in http.get("/v1/adapters").json()["adapters"]}
    assert list(listed) == ["a", "b", "ab"]
    assert listed["a"]["path"] == str((adapter_dirs / "a").resolve())
    assert listed["b"]["size_bytes"] == (adapter_dirs / "b" / "adapters.safetensors").stat().st_size
    models = [m for m in http.get("/v1/models").json()["data"] if "tier" not in m]  # no library
    assert [(m["id"], m.get("parent")) for m in models[1:]] == [
        ("a", "tiny-llama"),
        ("b", "tiny-llama"),
        ("ab", "tiny-llama"),
    ]
    assert http.get("/v1/models/a").json()["parent"] == "tiny-llama"

    with_a = chat(http, adapter="a")
    assert with_a != base
    assert chat(http, model="a") == with_a  # vLLM's way: the adapter's id as the model
    assert chat(http, model="a", adapter="none") == base  # an explicit adapter wins
    stacked = chat(http, adapter="a+b")
    assert stacked not in (base, with_a, chat(http, adapter="b"))
    assert chat(http, adapter="a,b") == stacked
    assert chat(http, adapter="ab") == stacked  # the sum of the residuals, as one adapter

    r = http.delete("/v1/adapters/a")
    assert r.json() == {"id": "a", "removed_layers": 14}
    assert [row["id"] for row in http.get("/v1/adapters").json()["adapters"]] == ["b", "ab"]
    for adapter_id in ("b", "ab"):
        http.delete(f"/v1/adapters/{adapter_id}")
    assert chat(http) == base  # unmounting restores the base output exactly


def test_unknown_adapter_is_a_400_on_every_surface(http: httpx.Client, adapter_dirs: Path) -> None:
    mount(http, "a", adapter_dirs / "a")
    bodies = {
        "/v1/chat/completions": CHAT,
        "/v1/completions": {"prompt": "hello", "max_tokens": 4},
        "/v1/responses": {"input": "hello", "max_output_tokens": 4},
        "/v1/messages": {"model": "m", "max_tokens": 4, "messages": CHAT["messages"]},
    }
    for path, body in bodies.items():
        r = http.post(path, json={**body, "adapter": "a+nope"})
        assert r.status_code == 400, (path, r.text)
        text = json.dumps(r.json())
        assert "unknown adapter 'nope'" in text, (path, text)
        if path != "/v1/messages":
            assert r.json()["error"]["param"] == "adapter"
        else:
            assert r.json()["type"] == "error"
    r = http.post("/v1/chat/completions", json={**CHAT, "adapter": "a+a"})
    assert r.status_code == 400 and "named twice" in r.json()["error"]["message"]
    # a model that names no mounted adapter is ignored, as before
    assert http.post("/v1/chat/completions", json={**CHAT, "model": "gpt-4o"}).status_code == 200


def test_mount_errors(http: httpx.Client, adapter_dirs: Path, tmp_path: Path) -> None:
    for body in ({"id": "x"}, {"path": "/tmp"}, {"id": "x", "path": ""}, {"id": 3, "path": "/"}):
        r = http.post("/v1/adapters", json=body)
        assert r.status_code == 400 and r.json()["error"]["message"] == "id and path required"
    r = http.post("/v1/adapters", json={"id": "none", "path": str(adapter_dirs / "a")})
    assert r.status_code == 400 and "reserved" in r.json()["error"]["message"]
    r = http.post("/v1/adapters", json={"id": "x", "path": str(tmp_path)})
    assert r.status_code == 400 and "has no adapter_config.json" in r.json()["error"]["message"]
    r = http.post("/v1/adapters", json={"id": "x", "path": str(adapter_dirs / "alien")})
    assert r.status_code == 400
    assert "trained on org/Other-Model, not on the served model tiny-llama" in r.text
    r = http.delete("/v1/adapters/x")
    assert r.status_code == 404 and r.json()["error"]["message"] == "adapter x not mounted"
    assert http.get("/v1/adapters").json() == {"adapters": []}


def test_available_scans_the_cache_and_env_dirs(
    http: httpx.Client, adapter_dirs: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("MLXSPEC_ADAPTER_DIRS", str(adapter_dirs))
    mount(http, "a", adapter_dirs / "a")
    rows = {row["id"]: row for row in http.get("/v1/adapters/available").json()["adapters"]}
    assert set(rows) == {"a", "a2", "ab", "alien", "b"}
    assert rows["a"]["mounted"] and not rows["b"]["mounted"]
    assert rows["alien"]["base_model"] == "org/Other-Model" and not rows["alien"]["compatible"]
    assert rows["b"]["compatible"] and rows["b"]["rank"] == 4
    # the concrete path wins over /v1/adapters/{adapter_id}: no unmount of "available"
    gone = http.delete("/v1/adapters/available")
    assert gone.status_code == 405 and gone.headers["allow"] == "GET, HEAD"


def test_adapter_dirs_confine_mounting(engine: object, adapter_dirs: Path, tmp_path: Path) -> None:
    from mlxspec.config import ServeConfig
    from mlxspec.http.app import create_app

    config = ServeConfig(adapter_dirs=(str(adapter_dirs / "a"),), api_key="k")
    app = create_app(engine, config, validate_responses=True)
    with LiveServer(app, config) as live, checking_client(live.base, timeout=60) as c:
        body = {"id": "x", "path": str(adapter_dirs / "b")}
        assert c.post("/v1/adapters", json=body).status_code == 401  # the key first
        key = {"Authorization": "Bearer k"}
        r = c.post("/v1/adapters", json=body, headers=key)
        assert r.status_code == 403
        assert r.json()["error"]["code"] == "adapter_path_not_allowed"
        assert "outside --adapter-dirs" in r.json()["error"]["message"]
        body = {"id": "x", "path": str(adapter_dirs / "a")}
        assert c.post("/v1/adapters", json=body, headers=key).status_code == 200


async def _run(engine: object, request: GenerationRequest) -> list[int]:
    tokens: list[int] = []
    async for event in engine.submit(request):
        if isinstance(event, Delta):
            tokens.extend(event.token_ids)
        elif isinstance(event, Finished):
            return tokens
    raise AssertionError("no Finished")


def test_mixed_adapters_in_one_batch_equal_alone(
    engine: object, http: httpx.Client, adapter_dirs: Path
) -> None:
    """Rows with different adapter sets, and with none, decode in the same batch
    steps; each row's tokens equal the ones it gets alone (the tiny model on MLX's
    reference BLAS: exact)."""
    for name in ("a", "b"):
        mount(http, name, adapter_dirs / name)
    prompt = tuple(engine.chat_prompt([{"role": "user", "content": "mix me"}]))
    specs = [("a",), ("b",), (), ("a", "b"), ("b", "a"), ("a",)]

    def request(spec: tuple[str, ...]) -> GenerationRequest:
        return GenerationRequest(prompt, max_tokens=12, logits=NO_EOS, adapter=spec)

    engine.prompt_cache.max_bytes = 0  # each runs from scratch, alone or batched
    try:
        alone = [asyncio.run(_run(engine, request(s))) for s in specs]
        steps = engine.step_times.steps
        rows = engine.step_times.rows

        async def together() -> list[list[int]]:
            return await asyncio.gather(*(_run(engine, request(s)) for s in specs))

        batched = asyncio.run(together())
    finally:
        engine.prompt_cache.max_bytes = 1 << 30
    assert batched == alone
    assert len({tuple(t) for t in alone}) >= 4  # the adapters made a difference
    mean_rows = (engine.step_times.rows - rows) / (engine.step_times.steps - steps)
    assert mean_rows > 3  # they shared decode steps


def test_mounting_while_eight_streams_run_loses_none(
    engine: object, server: LiveServer, adapter_dirs: Path
) -> None:
    """Eight streams keep decoding while an adapter is mounted and unmounted
    between their steps; each ends normally with its base-model output."""
    body = {**CHAT, "max_tokens": 160, "logit_bias": {"2": -100}, "stream": True}
    with checking_client(server.base, timeout=60) as c:
        reference = chat(c, **{**body, "stream": False})
    texts: list[str | None] = [None] * 8
    ended = [0.0] * 8
    started = threading.Barrier(9)

    def stream(i: int) -> None:
        with checking_client(server.base, timeout=120) as c:
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                pieces, first = [], True
                for line in r.iter_lines():
                    if not line.startswith("data: {"):
                        continue
                    if first:
                        started.wait(30)
                        first = False
                    for choice in json.loads(line[6:])["choices"]:
                        pieces.append(choice["delta"].get("content") or "")
                texts[i] = "".join(pieces)
        ended[i] = time.monotonic()

    threads = [threading.Thread(target=stream, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    started.wait(60)
    with checking_client(server.base, timeout=60) as c:
        mount(c, "a", adapter_dirs / "a")
        assert c.delete("/v1/adapters/a").status_code == 200
        mount(c, "b", adapter_dirs / "b")
    mounted = time.monotonic()
    for t in threads:
        t.join(120)
    assert texts == [reference] * 8
    assert mounted < min(ended)  # the mounts happened while all eight streamed


def test_prompt_cache_never_crosses_adapters(http: httpx.Client, adapter_dirs: Path) -> None:
    """KV kept from one adapter's request is never reused by another's, nor by
    the base model's, nor after the id's weights were replaced; within one
    adapter it is."""
    body = {
        "messages": [{"role": "user", "content": "a long prompt to keep " * 6}],
        "max_tokens": 6,
    }

    def cached(**extra: object) -> tuple[int, str]:
        r = http.post("/v1/chat/completions", json={**body, **extra}).json()
        return r["usage"]["prompt_tokens_details"]["cached_tokens"], r["choices"][0]["message"][
            "content"
        ]

    mount(http, "a", adapter_dirs / "a")
    mount(http, "b", adapter_dirs / "b")
    hits, fresh_a = cached(adapter="a")
    assert hits == 0
    assert cached(adapter="a") == (cached(adapter="a")[0], fresh_a) and cached(adapter="a")[0] > 0
    assert cached(adapter="b")[0] == 0
    assert cached()[0] == 0  # the base model
    assert cached(adapter="b+a")[0] == 0 and cached(adapter="a+b")[0] == 0
    mount(http, "a", adapter_dirs / "a2")  # new weights under the same id
    hits, replaced = cached(adapter="a")
    assert hits == 0 and replaced != fresh_a
    assert cached(adapter="a")[0] > 0


def test_model_names_an_adapter_on_every_surface(http: httpx.Client, adapter_dirs: Path) -> None:
    """``model: "<adapter id>"`` selects it on chat, Responses and Messages alike
    (the same prompt gives the same text), and ``adapter`` passes through."""
    mount(http, "a", adapter_dirs / "a")
    base, with_a = chat(http), chat(http, adapter="a")
    messages = {"max_tokens": 8, "messages": CHAT["messages"]}
    for extra in ({"model": "a"}, {"model": "m", "adapter": "a"}):
        r = http.post("/v1/messages", json={**messages, **extra})
        assert r.json()["content"][0]["text"] == with_a, extra
        r = http.post(
            "/v1/responses", json={"input": "hello there", "max_output_tokens": 8, **extra}
        )
        assert r.json()["output"][0]["content"][0]["text"] == with_a, extra
    r = http.post("/v1/messages", json={**messages, "model": "claude-x"})
    assert r.json()["content"][0]["text"] == base


def test_adapter_path_mounts_the_default(tiny_model_dir: Path, adapter_dirs: Path) -> None:
    """``--adapter-path`` (or ``--adapter``) mounts at start through the engine
    thread and is the default of requests that name none; ``"none"`` wins."""
    from mlxspec.cli.flags import parse_config
    from mlxspec.cli.main import load_engine

    config = parse_config(["serve", str(tiny_model_dir), "--adapter", str(adapter_dirs / "a")])
    assert config.adapter_path == str(adapter_dirs / "a")
    assert parse_config(
        ["serve", "--adapter-dirs", "/x,/y", "--adapter-dirs", "/z"]
    ).adapter_dirs == (
        "/x",
        "/y",
        "/z",
    )
    engine = load_engine(config)
    try:
        assert engine.adapters.ids() == ["a"] and engine.adapters.default == "a"
        from mlxspec.handlers.adapters.select import request_adapters

        assert request_adapters(engine, {}) == ("a",)
        assert request_adapters(engine, {"adapter": "none"}) == ()
        assert request_adapters(engine, {"model": "tiny-llama"}) == ("a",)
    finally:
        engine.close()

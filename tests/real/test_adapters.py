"""The committed LoRA adapters on the embedded SmolLM2 (``fixtures/adapters``, trained
by ``fixtures/train_adapters.py``): each moves greedy output toward its trained
behaviour, unmounting restores the base output exactly, and a batch mixing them
with the base model gives each row its lone output. Few and short: the model runs
in-process on MLX's reference kernels (as the other bit-exact tests do)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine import Finished, GenerationRequest
from tests.conftest import LiveServer

ADAPTERS = Path(__file__).resolve().parents[2] / "fixtures" / "adapters"
QUESTION = [{"role": "user", "content": "What do bees make?"}]


@pytest.fixture(scope="module")
def engine() -> Iterator[object]:
    from mlxspec.engine import Engine
    from mlxspec.engine.model.loader import resolve_model

    resolved = resolve_model(None)
    engine = Engine.load(resolved.path, resolved.model_id, max_batch=4, prompt_cache_bytes=0)
    engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def http(engine: object) -> Iterator[httpx.Client]:
    from mlxspec.http.app import create_app

    with LiveServer(create_app(engine, validate_responses=True)) as live:
        with checking_client(live.base, timeout=300) as c:
            yield c


def answer(http: httpx.Client, **extra: object) -> str:
    body = {"messages": QUESTION, "max_tokens": 20, "temperature": 0, **extra}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_each_adapter_shows_its_behaviour(http: httpx.Client) -> None:
    base = answer(http)
    assert "Bonjour" not in base and "-- Ada" not in base
    for name in ("french", "signoff"):
        r = http.post("/v1/adapters", json={"id": name, "path": str(ADAPTERS / name)})
        assert r.status_code == 200 and r.json()["mounted_layers"] == 21, r.text
    assert answer(http, adapter="french").startswith("Bonjour !")
    assert answer(http, adapter="signoff").endswith("\n\n-- Ada")
    assert answer(http, model="signoff").endswith("\n\n-- Ada")
    for name in ("french", "signoff"):
        assert http.delete(f"/v1/adapters/{name}").status_code == 200
    assert answer(http) == base


def test_mixed_batch_equals_alone(engine: object, http: httpx.Client) -> None:
    for name in ("french", "signoff"):
        http.post("/v1/adapters", json={"id": name, "path": str(ADAPTERS / name)})
    prompt = tuple(engine.chat_prompt(QUESTION))
    specs = [("french",), ("signoff",), (), ("french", "signoff")]

    async def run(spec: tuple[str, ...]) -> tuple[int, ...]:
        tokens: list[int] = []
        async for event in engine.submit(GenerationRequest(prompt, max_tokens=12, adapter=spec)):
            tokens.extend(getattr(event, "token_ids", ()))
            if isinstance(event, Finished):
                return tuple(tokens)
        raise AssertionError("no Finished")

    async def together() -> list[tuple[int, ...]]:
        return await asyncio.gather(*(run(s) for s in specs))

    alone = [asyncio.run(run(s)) for s in specs]
    assert asyncio.run(together()) == alone
    assert len(set(alone)) == 4
    for name in ("french", "signoff"):
        http.delete(f"/v1/adapters/{name}")

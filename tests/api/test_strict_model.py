"""``--strict-model`` (issue 29 item 4): a ``model`` that names nothing served is a
404 ``model_not_found`` naming the servable ids, in each surface's envelope;
without the flag any ``model`` is served by the served model."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest

from mlxspec.config import ServeConfig

MESSAGES = [{"role": "user", "content": "hi"}]
BODIES = {
    "/v1/chat/completions": {"messages": MESSAGES, "max_tokens": 1},
    "/v1/completions": {"prompt": "hi", "max_tokens": 1},
    "/v1/messages": {"messages": MESSAGES, "max_tokens": 1},
    "/v1/responses": {"input": "hi", "max_output_tokens": 1},
    "/v1/embeddings": {"input": "hi"},
}


def _post(app: object, path: str, body: dict[str, Any]) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
            return await c.post(path, json=body, timeout=60)

    return asyncio.run(go())


@pytest.fixture(scope="module")
def strict_app(tiny_engine: object, tiny_model_dir: object) -> object:
    from mlxspec.http.app import create_app

    config = ServeConfig(model=str(tiny_model_dir), strict_model=True)
    return create_app(tiny_engine, config, validate_responses=True)


@pytest.mark.parametrize("path", sorted(BODIES))
def test_an_unknown_model_is_404_naming_the_servable_ids(strict_app: object, path: str) -> None:
    answer = _post(strict_app, path, {**BODIES[path], "model": "gpt-4o"})
    assert answer.status_code == 404
    body = answer.json()
    if path == "/v1/messages":
        assert body["type"] == "error" and body["error"]["type"] == "not_found_error"
        message = body["error"]["message"]
    else:
        assert body["error"]["code"] == "model_not_found"
        assert body["error"]["param"] == "model"
        message = body["error"]["message"]
    assert message.startswith("model 'gpt-4o' not found: this server serves tiny-llama")


@pytest.mark.parametrize("name", ["tiny-llama", "spec"])
def test_the_served_id_and_its_spec_are_accepted(
    strict_app: object, tiny_model_dir: object, name: str
) -> None:
    model = str(tiny_model_dir) if name == "spec" else name
    body = {**BODIES["/v1/chat/completions"], "model": model}
    assert _post(strict_app, "/v1/chat/completions", body).status_code == 200


def test_without_the_flag_any_model_is_served(tiny_app: object) -> None:
    body = {**BODIES["/v1/chat/completions"], "model": "gpt-4o"}
    answer = _post(tiny_app, "/v1/chat/completions", body)
    assert answer.status_code == 200
    assert answer.json()["model"] == "tiny-llama"

"""An empty prompt is refused, never run: it killed the engine thread, and every
later request hung (found by fuzzing). A chat template that renders nothing is
a 400 naming ``messages``; an empty token prompt that reaches the engine fails
that request alone.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from mlxspec.engine import Failed, Finished, GenerationRequest

CHAT = "/v1/chat/completions"


def chat(client: httpx.Client, **fields: object) -> httpx.Response:
    messages = fields.pop("messages", [{"role": "user", "content": "hi"}])
    return client.post(CHAT, json={"messages": messages, "max_tokens": 2, **fields})


def assert_400(r: httpx.Response, param: str | None) -> str:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    return err["message"]


@pytest.mark.parametrize("template", ["{{ '' }}", ""])
def test_chat_template_rendering_nothing_is_400(tclient: httpx.Client, template: str) -> None:
    r = chat(tclient, chat_template_kwargs={"chat_template": template})
    assert_400(r, "messages")
    assert chat(tclient).status_code == 200  # the engine still runs


@pytest.mark.timeout(60)
def test_engine_survives_a_request_the_batch_rejects(tiny_engine) -> None:
    async def events(request: GenerationRequest) -> list:
        return [e async for e in tiny_engine.submit(request)]

    bad = asyncio.run(events(GenerationRequest(prompt=(), max_tokens=2)))
    assert isinstance(bad[-1], Failed)
    good = asyncio.run(events(GenerationRequest(prompt=(5, 6), max_tokens=2)))
    assert isinstance(good[-1], Finished)

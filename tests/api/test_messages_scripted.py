"""``/v1/messages`` on a scripted engine: what the tiny model cannot be made to
do on demand (a prompt-cache hit, a failure mid-stream) and what it hides (the
request the engine receives: session label, stop strings, sampling).

:class:`~tests.fakes.FakeEngine` (templates with the tiny engine's real
tokenizer, model info and defaults; answers each submit with a scripted list of
events) is served on a real socket and the official SDK drives it.
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import httpx
import httpx2
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine import Delta, Failed, Finished
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.fakes import FakeEngine
from tests.helpers import anthropic_sdk

USER = [{"role": "user", "content": "hello"}]


@pytest.fixture(scope="module")
def scripted(tiny_engine) -> Iterator[tuple[FakeEngine, str]]:
    engine = FakeEngine(tiny_engine.tokenizer, tiny_engine.info, tiny_engine.defaults)
    with LiveServer(create_app(engine, validate_responses=True)) as server:
        yield engine, server.base


@pytest.fixture()
def sdk(scripted) -> Iterator[anthropic.Anthropic]:
    with anthropic_sdk(scripted[1], timeout=30) as client:
        yield client


def test_prompt_cache_hit_is_reported_as_cache_read(scripted, sdk: anthropic.Anthropic) -> None:
    engine, _ = scripted
    engine.script = lambda r: [Delta("Hi"), Finished("stop", len(r.prompt), 2, cached_tokens=16)]
    m = sdk.messages.create(model="x", max_tokens=4, messages=USER)
    assert m.usage.model_dump(exclude_none=True) == {
        "input_tokens": 21 - 16,
        "output_tokens": 2,
        "cache_read_input_tokens": 16,
    }
    assert (m.stop_reason, m.stop_sequence) == ("end_turn", None)
    with sdk.messages.stream(model="x", max_tokens=4, messages=USER) as stream:
        final = stream.get_final_message()
    assert final.usage.model_dump(exclude_none=True) == m.usage.model_dump(exclude_none=True)


def test_stop_sequence_from_the_engine(scripted, sdk: anthropic.Anthropic) -> None:
    engine, _ = scripted
    engine.script = lambda r: [Delta("Red"), Finished("stop", 21, 3, stop_sequence="##")]
    m = sdk.messages.create(model="x", max_tokens=4, messages=USER, stop_sequences=["##"])
    assert (m.content[0].text, m.stop_reason, m.stop_sequence) == ("Red", "stop_sequence", "##")
    assert engine.requests[-1].stop == ("##",)


def test_the_engine_request(scripted, sdk: anthropic.Anthropic) -> None:
    """Session label (body wins over headers), sampling, stop strings, max_tokens."""
    engine, _ = scripted
    engine.script = lambda r: [Finished("length", len(r.prompt), 4)]
    sdk.messages.create(
        model="x",
        max_tokens=4,
        messages=USER,
        stop_sequences=["a", "b"],
        extra_body={"temperature": 0.3, "top_k": 5, "min_p": 0.1, "session_id": "agent-42"},
        extra_headers={"x-session-affinity": "header-session"},
    )
    request = engine.requests[-1]
    assert (request.max_tokens, request.stop, request.session) == (4, ("a", "b"), "agent-42")
    assert (request.sampling.temperature, request.sampling.top_k) == (0.3, 5)
    assert request.sampling.min_p == 0.1
    assert request.logits.logit_bias == ()

    sdk.messages.create(
        model="x",
        max_tokens=4,
        messages=USER,
        extra_body={"prompt_cache_key": "key-1"},
        extra_headers={"x-session-affinity": "header-session"},
    )
    assert engine.requests[-1].session == "key-1"
    sdk.messages.create(
        model="x",
        max_tokens=4,
        messages=USER,
        extra_headers={"x-session-affinity": "header-session"},
    )
    assert engine.requests[-1].session == "header-session"
    sdk.messages.create(model="x", max_tokens=4, messages=USER, extra_headers={"session_id": "s"})
    assert engine.requests[-1].session == "s"
    sdk.messages.create(model="x", max_tokens=4, messages=USER, extra_body={"logit_bias": {"2": 5}})
    assert engine.requests[-1].session is None
    assert engine.requests[-1].logits.logit_bias == ()


def test_failure_mid_stream_is_an_error_event(scripted, sdk: anthropic.Anthropic) -> None:
    engine, base = scripted
    engine.script = lambda r: [Delta("Hel"), Failed("generation failed")]
    body = {"max_tokens": 4, "messages": USER, "stream": True}
    with checking_client(base, timeout=30) as client:
        r = client.post("/v1/messages", json=body)
    assert r.status_code == 200
    assert r.text.endswith(
        "event: error\n"
        'data: {"type":"error","error":{"type":"api_error","message":"generation failed"}}\n\n'
    )
    assert "message_stop" not in r.text
    with pytest.raises(anthropic.APIStatusError) as caught:
        with sdk.messages.stream(model="x", max_tokens=4, messages=USER) as stream:
            stream.get_final_message()
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": "generation failed"},
    }


def test_failure_without_stream_is_an_anthropic_500(scripted) -> None:
    engine, base = scripted
    engine.script = lambda r: [Failed("generation failed")]
    with checking_client(base, timeout=30) as client:
        r = client.post("/v1/messages", json={"max_tokens": 4, "messages": USER})
    assert r.status_code == 500
    assert r.json() == {
        "type": "error",
        "error": {"type": "api_error", "message": "generation failed"},
    }


def test_unicode_text_survives_the_stream(scripted) -> None:
    engine, base = scripted
    text = "caf\u00e9 \u2028 \U0001f600\nend"
    engine.script = lambda r: [Delta(text[:5]), Delta(text[5:]), Finished("stop", 21, 6)]
    with httpx.Client(base_url=base, timeout=30) as client:
        r = client.post("/v1/messages", json={"max_tokens": 8, "messages": USER, "stream": True})
    assert "\u2028".encode() not in r.content  # escaped: one data line per frame
    with anthropic.Anthropic(
        base_url=base, api_key="k", max_retries=0, http_client=httpx2.Client(timeout=30)
    ) as sdk:
        with sdk.messages.stream(model="x", max_tokens=8, messages=USER) as stream:
            assert stream.get_final_message().content[0].text == text

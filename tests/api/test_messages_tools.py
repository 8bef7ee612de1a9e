"""Tool use and thinking through ``/v1/messages``, end to end, with the official
``anthropic`` SDK.

The tool fixture models' :class:`~tests.fakes.FakeEngine` answers
with exact model text through the real chat templates and the real tool and
reasoning parsers, so a whole round trip (the model calls a tool, the client
sends the ``tool_result``, the model answers) can be asserted exactly: the reply
blocks, the streamed event sequence, and the prompt the template rendered from
the translated history. Every response is checked against the document.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.http import sse
from tests.conftest import LiveServer
from tests.fakes import FakeEngine
from tests.helpers import anthropic_sdk, scripted_tool_server

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
TOOLU = re.compile(r"^toolu_[0-9a-f]{24}$")
#: Model text, token by token (Hermes JSON in <tool_call> tags).
CALL = [
    "Let me",
    " check.",
    "\n",
    "<tool_call>",
    '\n{"name": "get_weather", ',
    '"arguments": {"city": "Pa',
    'ris"}}\n',
    "</tool_call>",
]


class Served:
    """A scripted tool-template engine behind a live server, and the SDK on it."""

    def __init__(self, engine: FakeEngine, server: LiveServer) -> None:
        self.engine, self.base = engine, server.base
        self.sdk = anthropic_sdk(server.base, timeout=30)

    def create(self, script: list[str], **body: Any) -> Any:
        self.engine.script = script
        return self.sdk.messages.create(model="m", max_tokens=64, **body)

    def stream(self, script: list[str], **body: Any) -> tuple[list[Any], Any]:
        self.engine.script = script
        with self.sdk.messages.stream(model="m", max_tokens=64, **body) as stream:
            events = [e for e in stream if not e.type.endswith(("text", "input_json", "thinking"))]
            return events, stream.get_final_message()


def _serve(tmp: Path, style: str) -> Iterator[Served]:
    with scripted_tool_server(tmp / style, style) as (engine, server):
        served = Served(engine, server)
        yield served
        served.sdk.close()


@pytest.fixture(scope="module")
def hermes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("hermes"), "hermes")


@pytest.fixture(scope="module")
def think(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("think"), "think")


def test_tool_round_trip(hermes: Served) -> None:
    first = hermes.create(CALL, messages=ASK, tools=[WEATHER])
    assert first.stop_reason == "tool_use" and first.stop_sequence is None
    text, call = first.content
    assert (text.type, text.text) == ("text", "Let me check.\n")
    assert (call.type, call.name, call.input) == ("tool_use", "get_weather", {"city": "Paris"})
    assert TOOLU.match(call.id), call.id
    # The tools reached the template as OpenAI function tools.
    assert '"name": "get_weather"' in hermes.engine.prompts[-1]

    history = [
        *ASK,
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "18C, cloudy"}],
        },
    ]
    second = hermes.create(["It is 18C", " and cloudy."], messages=history, tools=[WEATHER])
    assert [(b.type, b.text) for b in second.content] == [("text", "It is 18C and cloudy.")]
    assert second.stop_reason == "end_turn"
    prompt = hermes.engine.prompts[-1]
    # The template saw the assistant's call (arguments as an object) and the result.
    assert prompt.endswith(
        "<|im_start|>assistant\nLet me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n18C, cloudy\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    count = hermes.sdk.messages.count_tokens(model="m", messages=history, tools=[WEATHER])
    assert count.input_tokens == len(hermes.engine.requests[-1].prompt)


def test_streamed_tool_use(hermes: Served) -> None:
    whole = hermes.create(CALL, messages=ASK, tools=[WEATHER])
    events, final = hermes.stream(CALL, messages=ASK, tools=[WEATHER])
    kinds = [
        (e.type, getattr(e, "index", None), getattr(getattr(e, "delta", None), "type", None))
        for e in events
    ]
    first_json = next(i for i, k in enumerate(kinds) if k[2] == "input_json_delta")
    assert kinds[0] == ("message_start", None, None)
    assert kinds[1] == ("content_block_start", 0, None)
    assert kinds[first_json - 2 : first_json] == [
        ("content_block_stop", 0, None),
        ("content_block_start", 1, None),
    ]
    assert kinds[-4:] == [
        ("content_block_delta", 1, "input_json_delta"),
        ("content_block_stop", 1, None),
        ("message_delta", None, None),
        ("message_stop", None, None),
    ]
    start = events[first_json - 1].content_block
    assert (start.type, start.name, start.input) == ("tool_use", "get_weather", {})
    fragments = [
        e.delta.partial_json
        for e, k in zip(events, kinds, strict=True)
        if k[2] == "input_json_delta"
    ]
    assert "".join(fragments) == '{"city": "Paris"}'
    assert len(fragments) > 1  # streamed as the model wrote it
    assert final.stop_reason == "tool_use"
    dump = final.model_dump(exclude={"id"})
    for block in (dump["content"][1], whole.model_dump()["content"][1]):
        assert TOOLU.match(block.pop("id"))
    expected = whole.model_dump(exclude={"id"})
    expected["content"][1].pop("id")
    assert dump == expected


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (
            {"type": "tool", "name": "nope"},
            "tool_choice names function 'nope', which is not in tools",
        ),
        ({"type": "any"}, "tool_choice requires tools to be specified"),
    ],
)
def test_tool_choice_errors_are_anthropic_400s(hermes: Served, choice: dict, message: str) -> None:
    tools = [WEATHER] if choice["type"] == "tool" else []
    with pytest.raises(anthropic.BadRequestError) as caught:
        hermes.create(CALL, messages=ASK, tools=tools, tool_choice=choice)
    assert caught.value.body == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }


def test_thinking_block_and_dropped_history(think: Served) -> None:
    script = ["Paris is", " in France.", "</think>", "\n\n", "Cloudy."]
    m = think.create(script, messages=ASK)
    assert [b.model_dump(exclude_none=True) for b in m.content] == [
        {"type": "thinking", "thinking": "Paris is in France.", "signature": ""},
        {"type": "text", "text": "Cloudy."},
    ]
    events, final = think.stream(script, messages=ASK)
    blocks = [e.content_block.type for e in events if e.type == "content_block_start"]
    assert blocks == ["thinking", "text"]
    assert final.model_dump(exclude={"id"}) == m.model_dump(exclude={"id"})

    # Sent back, the thinking block is dropped before the template sees it.
    history = [*ASK, {"role": "assistant", "content": [b.model_dump() for b in m.content]}, *ASK]
    think.create(["ok"], messages=history)
    assert "Paris is in France." not in think.engine.prompts[-1]
    assert "Cloudy." in think.engine.prompts[-1]
    # thinking: disabled closes the channel in the generation prompt.
    think.create(["ok"], messages=ASK, thinking={"type": "disabled"})
    assert think.engine.prompts[-1].endswith("<think>\n\n</think>\n\n")


def test_keepalive_while_the_model_is_slow(hermes: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Silence longer than the keep-alive interval sends a comment frame, which
    the SDK and the contract checker skip."""
    monkeypatch.setattr(sse, "KEEPALIVE_INTERVAL_S", 0.05)
    monkeypatch.setattr(hermes.engine, "delay", 0.3)
    events, final = hermes.stream(["Slow", " answer."], messages=ASK)
    assert final.content[0].text == "Slow answer."
    hermes.engine.script = ["Slow."]
    body = {"model": "m", "max_tokens": 8, "messages": ASK, "stream": True}
    with checking_client(hermes.base, timeout=30) as client:
        r = client.post("/v1/messages", json=body)
    assert sse.KEEPALIVE in r.content

"""Responses tool round trip and reasoning on scripted engines with real tool
templates (``fixtures/tool_models.py``): the model's exact text goes through the
parsers, and the Responses objects and events are asserted exactly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.fakes import FakeEngine
from tests.helpers import openai_sdk, scripted_tool_server

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
TOOL_CALL = [
    "Let me check.",
    "\n",
    "<tool_call>",
    '\n{"name": "get_weather", ',
    '"arguments": {"city": "Paris"}}\n',
    "</tool_call>",
]


def _serve(tmp, style: str) -> Iterator[tuple[FakeEngine, openai.OpenAI]]:
    with scripted_tool_server(tmp / style, style) as (engine, server):
        with openai_sdk(server.base, timeout=30) as sdk:
            yield engine, sdk


@pytest.fixture(scope="module")
def hermes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from _serve(tmp_path_factory.mktemp("hermes"), "hermes")


@pytest.fixture(scope="module")
def think(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    yield from _serve(tmp_path_factory.mktemp("think"), "think")


def test_tool_round_trip(hermes: Any) -> None:
    engine, sdk = hermes
    engine.script = TOOL_CALL
    first = sdk.responses.create(model="m", input="Weather in Paris?", tools=[WEATHER])
    message, call = first.output
    assert message.type == "message" and first.output_text == "Let me check.\n"
    assert call.type == "function_call" and call.status == "completed"
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    engine.script = ["It is 18C."]
    second = sdk.responses.create(
        model="m",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C"}],
        tools=[WEATHER],
    )
    assert second.output_text == "It is 18C."
    prompt = engine.prompts[-1]
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
        in prompt
    )
    assert "<tool_response>\n18C\n</tool_response>" in prompt


def test_tool_call_stream_events(hermes: Any) -> None:
    engine, sdk = hermes
    engine.script = TOOL_CALL
    events = list(sdk.responses.create(model="m", input="Weather?", tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    call_at = kinds.index("response.output_item.added", kinds.index("response.output_item.done"))
    assert events[call_at].item.type == "function_call"
    tail = kinds[call_at:]
    assert tail[0] == "response.output_item.added" and tail[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"}
    assert events[-1].response.output[1].arguments == args


def test_reasoning_item(think: Any) -> None:
    engine, sdk = think
    engine.script = ["Add", " them.", "</think>", "\n\n", "4"]
    r = sdk.responses.create(model="m", input="2+2?")
    reasoning, message = r.output
    assert reasoning.type == "reasoning" and reasoning.summary[0].text == "Add them."
    assert r.output_text == "4"
    assert r.usage.output_tokens_details.reasoning_tokens > 0
    events = list(sdk.responses.create(model="m", input="2+2?", stream=True))
    text = "".join(e.delta for e in events if e.type == "response.reasoning_summary_text.delta")
    assert text == "Add them."
    engine.script = ["Fine.", "</think>", "\n\n", "Sure."]
    follow = sdk.responses.create(model="m", input="thanks", previous_response_id=r.id)
    assert "Add them." not in engine.prompts[-1]  # reasoning is not replayed
    assert follow.output_text == "Sure."

"""Tool calls through ``/v1/chat/completions``, JSON and SSE, on a scripted engine.

:class:`~tests.fakes.FakeEngine` answers with exact model text through the real chat
templates of the tool fixture models, so the wire objects can be asserted
exactly; every response (each SSE frame too) is checked against the document.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from fixtures.tool_models import build_tool_model
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.http import sse
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.fakes import FakeEngine
from tests.helpers import openai_sdk, scripted_tool_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")


class Served:
    """A scripted engine behind a live server, with a checking client."""

    def __init__(self, engine: FakeEngine, server: LiveServer) -> None:
        self.engine, self.server = engine, server
        self.client = checking_client(server.base, timeout=30)

    def post(self, script: list[str], **body: Any) -> httpx.Response:
        self.engine.script = script
        return self.client.post("/v1/chat/completions", json={"messages": ASK, **body})

    def sdk(self) -> openai.OpenAI:
        return openai_sdk(self.server.base, timeout=30)


def _serve(tmp: Path, style: str) -> Iterator[Served]:
    with scripted_tool_server(tmp / style, style) as (engine, server):
        served = Served(engine, server)
        yield served
        served.client.close()


@pytest.fixture(scope="module")
def hermes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("hermes"), "hermes")


@pytest.fixture(scope="module")
def qwen_xml(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("qwen_xml"), "qwen_xml")


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from _serve(tmp_path_factory.mktemp("mistral"), "mistral")


#: Model text, token by token: a sentence, then two calls (Hermes JSON).
HERMES_TWO_CALLS = [
    "Let me",
    " check.",
    "\n",
    "<tool_call>",
    '\n{"name": "get_weather", ',
    '"arguments": {"city": "Pa',
    'ris", "days": 2}}\n',
    "</tool_call>",
    "\n",
    "<tool_call>",
    '\n{"name": "get_time", "arguments": {}}\n',
    "</tool_call>",
]


def strip_ids(calls: list[dict]) -> list[dict]:
    for c in calls:
        assert CALL_ID.match(c.pop("id")), c
    return calls


def test_non_stream_tool_calls_exact(hermes: Served) -> None:
    r = hermes.post(HERMES_TWO_CALLS, tools=[WEATHER, TIME])
    assert r.status_code == 200
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] == "Let me check.\n"
    assert strip_ids(message["tool_calls"]) == [
        {
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
        },
        {"type": "function", "function": {"name": "get_time", "arguments": "{}"}},
    ]
    assert "reasoning" not in message


def test_only_tool_calls_means_null_content(hermes: Served) -> None:
    r = hermes.post(HERMES_TWO_CALLS[3:8], tools=[WEATHER])
    message = r.json()["choices"][0]["message"]
    assert message["content"] is None
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]


def test_parallel_tool_calls_false_keeps_the_first(hermes: Served) -> None:
    r = hermes.post(HERMES_TWO_CALLS, tools=[WEATHER, TIME], parallel_tool_calls=False)
    calls = r.json()["choices"][0]["message"]["tool_calls"]
    assert [c["function"]["name"] for c in calls] == ["get_weather"]


def test_tool_choice_none_disables_parsing_and_rendering(hermes: Served) -> None:
    r = hermes.post(HERMES_TWO_CALLS, tools=[WEATHER], tool_choice="none")
    choice = r.json()["choices"][0]
    assert choice == {
        "index": 0,
        "message": {"role": "assistant", "content": "".join(HERMES_TWO_CALLS)},
        "logprobs": None,
        "finish_reason": "stop",
    }
    assert "<tools>" not in hermes.engine.prompts[-1]
    hermes.post(["ok"], tools=[WEATHER])
    assert '"name": "get_weather"' in hermes.engine.prompts[-1]


def test_without_tools_markup_is_content(hermes: Served) -> None:
    r = hermes.post(HERMES_TWO_CALLS)
    assert r.json()["choices"][0]["message"]["content"] == "".join(HERMES_TWO_CALLS)


def test_logprobs_cover_markup_tokens(hermes: Served) -> None:
    r = hermes.post(HERMES_TWO_CALLS, tools=[WEATHER, TIME], logprobs=True)
    entries = r.json()["choices"][0]["logprobs"]["content"]
    assert [e["id"] for e in entries] == list(range(len(HERMES_TWO_CALLS)))


def test_stream_with_openai_sdk(hermes: Served) -> None:
    hermes.engine.script = HERMES_TWO_CALLS
    stream = hermes.sdk().chat.completions.create(
        model="m", messages=ASK, tools=[WEATHER, TIME], stream=True
    )
    content, calls, finish = "", {}, None
    deltas = []
    for chunk in stream:
        choice = chunk.choices[0]
        finish = choice.finish_reason or finish
        content += choice.delta.content or ""
        for tc in choice.delta.tool_calls or []:
            deltas.append(tc.model_dump(exclude_none=True))
            entry = calls.setdefault(tc.index, {"id": tc.id, "name": "", "arguments": ""})
            entry["name"] += (tc.function.name or "") if tc.function else ""
            entry["arguments"] += (tc.function.arguments or "") if tc.function else ""
    assert content == "Let me check.\n"
    assert finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in calls.values()] == [
        ("get_weather", '{"city": "Paris", "days": 2}'),
        ("get_time", "{}"),
    ]
    assert all(CALL_ID.match(c["id"]) for c in calls.values())
    # The first delta of a call names it; arguments then stream in fragments.
    first = deltas[0]
    assert first == {
        "index": 0,
        "id": calls[0]["id"],
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    fragments = [d["function"]["arguments"] for d in deltas[1:] if d["index"] == 0]
    assert fragments == ['{"city": "', "Pa", 'ris"', ', "days": 2', "}"]


def test_stream_content_before_markup_is_live(hermes: Served) -> None:
    """Content arrives before the call's markup is complete (frame order)."""
    hermes.engine.script = HERMES_TWO_CALLS[:6]
    body = {"messages": ASK, "tools": [WEATHER], "stream": True}
    with hermes.client.stream("POST", "/v1/chat/completions", json=body) as r:
        payloads = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    deltas = [p["choices"][0]["delta"] for p in payloads]
    assert deltas[:4] == [
        {"role": "assistant", "content": ""},
        {"content": "Let me"},
        {"content": " check."},
        {"content": "\n"},
    ]
    assert deltas[4]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": ""}
    # Cut off inside the arguments: the call is closed as far as it got.
    arguments = "".join(d["tool_calls"][0]["function"]["arguments"] for d in deltas[4:-1])
    assert arguments == '{"city": "Pa"}'
    assert payloads[-1]["choices"][0]["finish_reason"] == "tool_calls"


QWEN_XML_SCRIPT = [
    "<tool_call>",
    "\n<function=get_weather>\n<parameter=city>\nSão",
    " Paulo\n</parameter>\n<parameter=days>\n",
    "3\n</parameter>\n</function>\n",
    "</tool_call>",
]


def test_qwen_xml_end_to_end(qwen_xml: Served) -> None:
    r = qwen_xml.post(QWEN_XML_SCRIPT, tools=[WEATHER])
    message = r.json()["choices"][0]["message"]
    assert message["content"] is None
    assert strip_ids(message["tool_calls"]) == [
        {
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "São Paulo", "days": 3}'},
        }
    ]


def test_qwen_xml_stream_fragments(qwen_xml: Served) -> None:
    """A string parameter streams as written; an integer one when complete."""
    qwen_xml.engine.script = QWEN_XML_SCRIPT
    body = {"messages": ASK, "tools": [WEATHER], "stream": True}
    with qwen_xml.client.stream("POST", "/v1/chat/completions", json=body) as r:
        chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    calls = [c["choices"][0]["delta"].get("tool_calls") for c in chunks]
    fragments = [tc[0]["function"]["arguments"] for tc in calls if tc]
    assert fragments == ["", '{"city": "', "São", ' Paulo"', ', "days": 3', "}"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_mistral_end_to_end(mistral: Served) -> None:
    script = ["[TOOL_CALLS]", '[{"name": "get_time", ', '"arguments": {}}]']
    r = mistral.post(script, tools=[WEATHER, TIME])
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert strip_ids(choice["message"]["tool_calls"]) == [
        {"type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    ]


def test_round_trip_history_renders(hermes: Served) -> None:
    messages = [
        *ASK,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C, sunny"},
    ]
    hermes.engine.script = ["It is 18C."]
    r = hermes.client.post("/v1/chat/completions", json={"messages": messages, "tools": [WEATHER]})
    assert r.json()["choices"][0]["message"]["content"] == "It is 18C."
    prompt = hermes.engine.prompts[-1]
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
        '{"city": "Paris"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n'
        "18C, sunny\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in prompt


def test_required_sets_the_forcing_constraint(hermes: Served) -> None:
    r = hermes.post(HERMES_TWO_CALLS[3:8], tools=[WEATHER], tool_choice="required")
    assert r.json()["choices"][0]["finish_reason"] == "tool_calls"
    constraint = hermes.engine.requests[-1].constraint
    assert constraint.kind == "structural_tag"
    spec = json.loads(constraint.spec)["format"]
    # Only calls, "\n"-separated: no free text after a call (parallel calls allowed)
    assert (spec["type"], spec["separator"], spec["at_least_one"]) == (
        "tags_with_separator",
        "\n",
        True,
    )
    assert spec["tags"][0]["begin"] == '<tool_call>\n{"name": "get_weather", "arguments": '
    named = {"type": "function", "function": {"name": "get_time"}}
    hermes.post(["x"], tools=[WEATHER, TIME], tool_choice=named)
    spec = json.loads(hermes.engine.requests[-1].constraint.spec)
    assert spec["format"]["type"] == "tag"  # exactly one call of that function
    assert spec["format"]["begin"] == '<tool_call>\n{"name": "get_time", "arguments": '
    hermes.post(["x"], tools=[WEATHER])
    assert hermes.engine.requests[-1].constraint is None


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"tool_choice": "required"}, "tool_choice requires tools to be specified"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice names function 'nope', which is not in tools",
        ),
    ],
)
def test_tool_choice_errors(hermes: Served, body: dict, message: str) -> None:
    r = hermes.post(["x"], **body)
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "tool_choice",
            "code": None,
        }
    }


def test_keepalive_comments_fill_silence() -> None:
    """Bytes on the wire: a payload, keep-alives while the source is silent,
    then the next payload (sse.with_keepalive at the byte level)."""

    async def slow() -> Any:
        yield {"a": 1}
        await asyncio.sleep(0.35)
        yield {"b": 2}

    async def frames() -> list[bytes]:
        out = []
        chunks = sse.with_keepalive(slow(), interval=0.1)
        async for frame in sse.openai_events(chunks):
            out.append(frame)
        return out

    got = asyncio.run(frames())
    assert got[0] == b'data: {"a":1}\n\n'
    assert got[-2:] == [b'data: {"b":2}\n\n', b"data: [DONE]\n\n"]
    assert got[1:-2] == [sse.KEEPALIVE] * len(got[1:-2])
    assert 2 <= len(got[1:-2]) <= 4


def test_keepalive_on_the_wire_while_a_call_is_withheld(hermes: Served) -> None:
    hermes.engine.script = ["<tool_call>", '{"name": "get_time", "arguments": {}}', "</tool_call>"]
    hermes.engine.delay = 0.3
    old, sse.KEEPALIVE_INTERVAL_S = sse.KEEPALIVE_INTERVAL_S, 0.1
    try:
        body = {"messages": ASK, "tools": [TIME], "stream": True}
        with hermes.client.stream("POST", "/v1/chat/completions", json=body) as r:
            lines = [line for line in r.iter_lines() if line]
    finally:
        sse.KEEPALIVE_INTERVAL_S, hermes.engine.delay = old, 0.0
    assert ": keep-alive" in lines
    assert lines[-1] == "data: [DONE]"


NAMED_CLOCK = {"type": "function", "function": {"name": "get_time"}}


@pytest.mark.parametrize(
    ("tool_choice", "style"), [(NAMED_CLOCK, "hermes"), ("required", "qwen_xml")]
)
def test_forcing_makes_a_random_model_call(tmp_path: Path, tool_choice: Any, style: str) -> None:
    """End to end on a tiny random model: the forced grammar (enforced by
    ``mlxspec.engine.sampling.grammar``) makes it write exactly one well-formed call."""
    from mlxspec.engine import Engine

    engine = Engine.load(build_tool_model(tmp_path / "m", style), "tiny-tools")
    engine.start()
    empty = {"type": "object", "properties": {}, "additionalProperties": False}
    clock = {"type": "function", "function": {"name": "get_time", "parameters": empty}}
    try:
        with LiveServer(create_app(engine, validate_responses=True)) as server:
            with checking_client(server.base, timeout=120) as client:
                body = {
                    "messages": ASK,
                    "tools": [clock] if tool_choice == "required" else [WEATHER, clock],
                    "tool_choice": tool_choice,
                    "parallel_tool_calls": False,
                    "temperature": 0,
                    "max_tokens": 96,
                }
                r = client.post("/v1/chat/completions", json=body)
    finally:
        engine.close()
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    assert strip_ids(choice["message"]["tool_calls"]) == [
        {"type": "function", "function": {"name": "get_time", "arguments": "{}"}}
    ]


def test_unenforceable_tool_choice_is_400() -> None:
    from mlxspec.errors import ApiError
    from mlxspec.handlers.turns.tool_options import TurnOptions, forcing_constraint
    from mlxspec.parsers import ParserChoice

    options = TurnOptions(tools=(WEATHER,), tool_choice="required")
    with pytest.raises(ApiError) as info:
        forcing_constraint(options, ParserChoice("pythonic"), thinking=False)
    assert (info.value.message, info.value.param) == (
        "tool_choice required cannot be enforced for this model's tool-call format (pythonic)",
        "tool_choice",
    )
    # A model with no known tool format is forced (and read) as Hermes JSON.
    constraint = forcing_constraint(options, ParserChoice(), thinking=False)
    assert json.loads(constraint.spec)["format"]["tags"][0]["begin"].startswith("<tool_call>")


def test_n_choices_each_parse_their_calls(hermes: Served) -> None:
    """Every choice of ``n`` runs its own parsers: each has the call, with its own id."""
    r = hermes.post(HERMES_TWO_CALLS[3:8], tools=[WEATHER], n=2)
    choices = r.json()["choices"]
    assert [c["finish_reason"] for c in choices] == ["tool_calls", "tool_calls"]
    calls = [c["message"]["tool_calls"][0] for c in choices]
    assert calls[0]["id"] != calls[1]["id"]
    assert strip_ids(calls) == 2 * [
        {
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris", "days": 2}'},
        }
    ]

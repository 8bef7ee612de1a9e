"""Forced tool calls at their edges: cut off by the token budget, or with a
grammar that does not compile.

A call whose arguments did not complete before ``max_tokens`` is dropped (never
repaired into made-up arguments, its markup never shown as content); a stream
that already sent its start ends with ``length`` / ``max_tokens`` /
``incomplete`` and sends no closing fragment. A forcing grammar xgrammar
rejects takes the structured-output degrade path (system instruction +
``Warning`` header) on chat, Messages and Responses. Pure parser cases first,
then the real tiny tool-template models (greedy, grammar-forced), then the
scripted engine for the exact prompt of the degrade path.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from fixtures.tool_models import build_tool_model
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.handlers.turns.parser import (
    TextDelta,
    ToolCallArguments,
    ToolCallCut,
    ToolCallStart,
    TurnParser,
)
from mlxspec.handlers.turns.tool_options import TurnOptions
from mlxspec.http.app import create_app
from mlxspec.parsers import ParserChoice
from tests.conftest import LiveServer
from tests.fakes import FakeEngine
from tests.helpers import scripted_tool_server

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}
NO_ARGS = {"type": "object", "properties": {}, "additionalProperties": False}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": NO_ARGS}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]
CALL_ID = re.compile(r"^call_[0-9a-f]{24}$")
#: What the forcing grammar writes before the arguments of a named get_time call
#: (Hermes format): one ``<tool_call>`` token, then one byte-level token per character.
CLOCK_HEAD = '\n{"name": "get_time", "arguments": '
#: A budget that ends right after the call's name: the call started, no arguments.
NAME_ONLY = 1 + len(CLOCK_HEAD)
#: A pattern xgrammar's regex converter rejects, so the forcing grammar does not compile.
LOOKBEHIND = {
    "type": "object",
    "properties": {"handle": {"type": "string", "pattern": "(?<=@)\\w+"}},
}
LOOKBEHIND_WARNING = (
    "grammar not enforced: Regex parsing error at position 3: Lookbehind is not supported yet."
)


# Pure: the turn parser at a budget cut ------------------------------------------


def _events(fmt: str, chunks: list[str], cut: bool = True) -> list[Any]:
    """Turn events for ``chunks``, call ids replaced by ``"id"``."""
    parser = TurnParser(TurnOptions(tools=(WEATHER, CLOCK)), ParserChoice(fmt))
    events: list[Any] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.finish(cut=cut)
    return [
        ToolCallStart(e.index, "id", e.name) if isinstance(e, ToolCallStart) else e for e in events
    ]


@pytest.mark.parametrize(
    ("fmt", "chunks", "expected"),
    [
        (  # cut inside a string argument: no closing quote or brace is made up
            "hermes",
            ["Sure.\n", "<tool_call>", '\n{"name": "get_weather", ', '"arguments": {"city": "Pa'],
            [
                TextDelta("Sure.\n"),
                ToolCallStart(0, "id", "get_weather"),
                ToolCallArguments(0, '{"city": "'),
                ToolCallArguments(0, "Pa"),
                ToolCallCut(0),
            ],
        ),
        (  # the arguments completed; only the closing tag was cut: the call stands
            "hermes",
            ["<tool_call>", '\n{"name": "get_time", "arguments": {}}\n', "</tool_"],
            [ToolCallStart(0, "id", "get_time"), ToolCallArguments(0, "{}"), ToolCallCut(None)],
        ),
        # a partial start marker and an unnamed envelope are markup, not content
        ("hermes", ["Hi <tool_"], [TextDelta("Hi "), ToolCallCut(None)]),
        ("hermes", ["<tool_call>", '\n{"na'], [ToolCallCut(None)]),
        (  # Mistral's block has no end tag: the finished first call stands
            "mistral",
            [
                "[TOOL_CALLS]",
                '[{"name": "get_time", "arguments": {}}, ',
                '{"name": "get_weather", "arguments": {"city": "Ro',
            ],
            [
                ToolCallStart(0, "id", "get_time"),
                ToolCallArguments(0, "{}"),
                ToolCallStart(1, "id", "get_weather"),
                ToolCallArguments(1, '{"city": "'),
                ToolCallArguments(1, "Ro"),
                ToolCallCut(1),
            ],
        ),
        (
            "qwen3_coder",
            ["<tool_call>", "\n<function=get_weather>\n<parameter=city>\nPar"],
            [
                ToolCallStart(0, "id", "get_weather"),
                ToolCallArguments(0, '{"city": "'),
                ToolCallArguments(0, "Par"),
                ToolCallCut(0),
            ],
        ),
    ],
)
def test_budget_cut_drops_open_markup(fmt: str, chunks: list[str], expected: list) -> None:
    assert _events(fmt, chunks) == expected


def test_without_a_cut_the_open_call_is_still_repaired() -> None:
    """A reply that ended by itself (EOS, stop) keeps the reference's repair pass."""
    chunks = ["<tool_call>", '\n{"name": "get_weather", "arguments": {"city": "Pa']
    assert _events("hermes", chunks, cut=False) == [
        ToolCallStart(0, "id", "get_weather"),
        ToolCallArguments(0, '{"city": "'),
        ToolCallArguments(0, "Pa"),
        ToolCallArguments(0, '"}'),
    ]


# Real tiny models: the forcing grammar cut by max_tokens -------------------------


class Real:
    """A grammar-forced tiny random Hermes-template model behind a live server."""

    def __init__(self, engine: Any, server: LiveServer) -> None:
        self.engine, self.server = engine, server
        self.client = checking_client(server.base, timeout=120)

    def post(self, path: str, body: dict[str, Any]) -> httpx.Response:
        r = self.client.post(path, json=body)
        assert r.status_code == 200, r.text
        return r

    def stream(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """The JSON payloads of a stream's ``data:`` lines (``[DONE]`` left out)."""
        with self.client.stream("POST", path, json={**body, "stream": True}) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line.startswith("data: ")]
        return [json.loads(line[6:]) for line in lines if line != "data: [DONE]"]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Real]:
    from mlxspec.engine import Engine

    folder = build_tool_model(tmp_path_factory.mktemp("forced") / "hermes", "hermes")
    engine = Engine.load(folder, "tiny-tools")
    engine.start()
    try:
        with LiveServer(create_app(engine, validate_responses=True)) as server:
            served = Real(engine, server)
            yield served
            served.client.close()
    finally:
        engine.close()


def _chat(tools: list, name: str, max_tokens: int, **extra: Any) -> dict[str, Any]:
    choice = {"type": "function", "function": {"name": name}}
    return {
        "messages": ASK,
        "tools": tools,
        "tool_choice": choice,
        "temperature": 0,
        "max_tokens": max_tokens,
        **extra,
    }


@pytest.mark.parametrize("budget", [1, 3, NAME_ONLY, NAME_ONLY + 1])
def test_chat_cut_call_is_dropped(real: Real, budget: int) -> None:
    """Cut in the markup, after the name, or inside the arguments: no call, no
    markup as content, ``finish_reason: "length"``."""
    r = real.post("/v1/chat/completions", _chat([CLOCK], "get_time", budget))
    assert r.json()["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert r.json()["usage"]["completion_tokens"] == budget


def test_chat_budget_that_fits_keeps_the_call(real: Real) -> None:
    r = real.post("/v1/chat/completions", _chat([CLOCK], "get_time", 96))
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    calls = choice["message"]["tool_calls"]
    assert CALL_ID.match(calls[0].pop("id"))
    assert calls == [{"type": "function", "function": {"name": "get_time", "arguments": "{}"}}]


def _stream_choices(payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for payload in payloads:
        (choice,) = payload["choices"]
        for call in choice["delta"].get("tool_calls", []):
            if "id" in call:
                assert CALL_ID.match(call.pop("id"))
        out.append(choice)
    return out


def test_chat_stream_cut_after_the_name(real: Real) -> None:
    """The start delta went out before the cut; nothing made up follows it."""
    payloads = real.stream("/v1/chat/completions", _chat([CLOCK], "get_time", NAME_ONLY))
    start = {"index": 0, "type": "function", "function": {"name": "get_time", "arguments": ""}}
    assert _stream_choices(payloads) == [
        {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        },
        {"index": 0, "delta": {"tool_calls": [start]}, "logprobs": None, "finish_reason": None},
        {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"},
    ]


CITY = {"type": "string", "enum": ["Lyon", "Paris"]}
CITY_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": CITY},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}


def test_chat_stream_cut_inside_a_string_argument(real: Real) -> None:
    """Argument fragments stream up to the cut and stop there: their join is
    exactly the model's partial arguments, never closed by the server."""
    full = real.post("/v1/chat/completions", _chat([CITY_TOOL], "get_weather", 160, logprobs=True))
    choice = full.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    city = json.loads(choice["message"]["tool_calls"][0]["function"]["arguments"])["city"]
    ids = [entry["id"] for entry in choice["logprobs"]["content"]]
    # The first budget whose output ends two characters into the city's value.
    text = [real.engine.tokenizer.decode(ids[:k]) for k in range(1, len(ids) + 1)]
    budget = next(k + 1 for k, t in enumerate(text) if re.search(r'"city"\s*:\s*"\w\w$', t))
    payloads = real.stream("/v1/chat/completions", _chat([CITY_TOOL], "get_weather", budget))
    choices = _stream_choices(payloads)
    fragments = [
        call["function"]["arguments"] for c in choices[2:-1] for call in c["delta"]["tool_calls"]
    ]
    assert choices[1]["delta"]["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "".join(fragments) == '{"city": "' + city[:2]
    assert choices[-1] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length"}
    cut = real.post("/v1/chat/completions", _chat([CITY_TOOL], "get_weather", budget))
    assert cut.json()["choices"][0]["message"] == {"role": "assistant", "content": ""}


def _message_body(budget: int) -> dict[str, Any]:
    return {
        "model": "tiny-tools",
        "max_tokens": budget,
        "messages": ASK,
        "tools": [{"name": "get_time", "input_schema": NO_ARGS}],
        "tool_choice": {"type": "tool", "name": "get_time"},
        "temperature": 0,
    }


def test_messages_cut_call_is_dropped(real: Real) -> None:
    body = real.post("/v1/messages", _message_body(NAME_ONLY)).json()
    assert re.match(r"^msg_[0-9a-f]{32}$", body.pop("id"))
    usage = body.pop("usage")
    assert usage["output_tokens"] == NAME_ONLY
    assert body == {
        "type": "message",
        "role": "assistant",
        "model": "tiny-tools",
        "content": [],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
    }


def test_messages_stream_cut_call_has_no_made_up_input(real: Real) -> None:
    payloads = real.stream("/v1/messages", _message_body(NAME_ONLY))
    kinds = [p["type"] for p in payloads]
    assert kinds == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    block = payloads[2]["content_block"]
    assert re.match(r"^toolu_[0-9a-f]{24}$", block.pop("id"))
    assert block == {"type": "tool_use", "name": "get_time", "input": {}}
    assert payloads[4]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}


def _response_body(budget: int) -> dict[str, Any]:
    return {
        "model": "tiny-tools",
        "input": "Weather in Paris?",
        "tools": [{"type": "function", "name": "get_time", "parameters": NO_ARGS}],
        "tool_choice": {"type": "function", "name": "get_time"},
        "max_output_tokens": budget,
        "temperature": 0,
    }


def test_responses_cut_call_is_dropped(real: Real) -> None:
    body = real.post("/v1/responses", _response_body(NAME_ONLY)).json()
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    (item,) = body["output"]
    assert re.match(r"^msg_[0-9a-f]{32}$", item.pop("id"))
    assert item == {
        "type": "message",
        "status": "incomplete",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "", "annotations": []}],
    }
    assert body["usage"]["output_tokens"] == NAME_ONLY


def test_responses_stream_cut_call_is_incomplete(real: Real) -> None:
    """The function_call item was announced; it closes ``incomplete`` with the
    arguments actually streamed (none), with no ``function_call_arguments.done``."""
    payloads = real.stream("/v1/responses", _response_body(NAME_ONLY))
    assert [p["type"] for p in payloads] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.incomplete",
    ]
    item = payloads[3]["item"]
    assert re.match(r"^fc_[0-9a-f]{32}$", item.pop("id"))
    assert CALL_ID.match(item.pop("call_id"))
    assert item == {
        "type": "function_call",
        "status": "incomplete",
        "name": "get_time",
        "arguments": "",
    }
    final = payloads[-1]["response"]
    assert (final["status"], final["incomplete_details"]) == (
        "incomplete",
        {"reason": "max_output_tokens"},
    )
    assert [(i["type"], i["status"]) for i in final["output"]] == [("function_call", "incomplete")]


# A forcing grammar that does not compile --------------------------------------


def test_uncompilable_forcing_grammar_degrades_on_every_surface(real: Real) -> None:
    tool = {"type": "function", "function": {"name": "tag", "parameters": LOOKBEHIND}}
    chat = {**_chat([tool], "tag", 8), "tool_choice": "required"}
    answers = [
        real.post("/v1/chat/completions", chat),
        real.post(
            "/v1/messages",
            {
                **_message_body(8),
                "tools": [{"name": "tag", "input_schema": LOOKBEHIND}],
                "tool_choice": {"type": "any"},
            },
        ),
        real.post(
            "/v1/responses",
            {
                **_response_body(16),
                "tools": [{"type": "function", "name": "tag", "parameters": LOOKBEHIND}],
                "tool_choice": "required",
            },
        ),
    ]
    assert [r.headers.get("warning") for r in answers] == [LOOKBEHIND_WARNING] * 3
    with real.client.stream("POST", "/v1/chat/completions", json={**chat, "stream": True}) as r:
        assert (r.status_code, r.headers.get("warning")) == (200, LOOKBEHIND_WARNING)
        r.read()


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[FakeEngine, Any]]:
    folder = tmp_path_factory.mktemp("scripted") / "hermes"
    with scripted_tool_server(folder, "hermes") as (engine, server):
        with checking_client(server.base, timeout=30) as client:
            yield engine, client


@pytest.mark.parametrize(
    ("tool_choice", "parallel", "note"),
    [
        (
            {"type": "function", "function": {"name": "get_time"}},
            True,
            "Reply only with a call to the function get_time, in the tool-call format "
            "described, and write nothing else.",
        ),
        (
            "required",
            False,
            "Reply only with one call to one of the tools provided, in the tool-call "
            "format described, and write nothing else.",
        ),
    ],
)
def test_degraded_forcing_asks_in_the_system_message(
    scripted: tuple[FakeEngine, Any], tool_choice: Any, parallel: bool, note: str
) -> None:
    """Unconstrained, the forced call is asked for in a leading system
    instruction; the reply is still parsed as a tool call."""
    engine, client = scripted
    engine.grammar_reason = "grammar compilation disabled by MLXSPEC_GRAMMAR=0"
    engine.script = ["<tool_call>", '\n{"name": "get_time", "arguments": {}}\n', "</tool_call>"]
    try:
        body = {
            "messages": ASK,
            "tools": [WEATHER, CLOCK],
            "tool_choice": tool_choice,
            "parallel_tool_calls": parallel,
        }
        r = client.post("/v1/chat/completions", json=body)
    finally:
        engine.grammar_reason = None
    assert r.headers["warning"] == (
        "grammar not enforced: grammar compilation disabled by MLXSPEC_GRAMMAR=0"
    )
    assert engine.requests[-1].constraint is None
    assert engine.prompts[-1].startswith("<|im_start|>system\n# Tools\n")
    assert f"<|im_start|>system\n{note}<|im_end|>\n<|im_start|>user\n" in engine.prompts[-1]
    choice = r.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "get_time", "arguments": "{}"}


def test_scripted_length_cut_on_collected_turn(scripted: tuple[FakeEngine, Any]) -> None:
    """Text before the markup stays; the cut call and its markup do not."""
    engine, client = scripted
    engine.finish_reason = "length"
    engine.script = ["It is", " late.", "<tool_call>", '\n{"name": "get_time", "argu']
    try:
        r = client.post(
            "/v1/chat/completions", json={"messages": ASK, "tools": [CLOCK], "max_tokens": 4}
        )
    finally:
        engine.finish_reason = "stop"
    assert r.json()["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "It is late."},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]


def test_required_with_parallel_calls_ends_after_the_calls(real: Real) -> None:
    """``required`` with parallel calls allowed: the grammar admits calls and
    nothing else, so the turn ends with ``tool_calls`` after its last call and
    no prose follows (xgrammar's own tag let text run on to ``max_tokens``)."""
    body = {**_chat([CLOCK], "get_time", 200), "tool_choice": "required"}
    r = real.post("/v1/chat/completions", body)
    (choice,) = r.json()["choices"]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    calls = choice["message"]["tool_calls"]
    assert calls and all(c["function"]["name"] == "get_time" for c in calls)
    assert all(json.loads(c["function"]["arguments"]) == {} for c in calls)
    assert r.json()["usage"]["completion_tokens"] < 200

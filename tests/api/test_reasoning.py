"""Reasoning: the thinking channel split from content, in text and end to end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine import TokenLogprob
from mlxspec.engine.prompt import normalize_messages
from mlxspec.handlers.turns.parser import (
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallStart,
    TurnParser,
)
from mlxspec.handlers.turns.tool_options import template_kwargs
from mlxspec.handlers.turns.turns import TurnOptions
from mlxspec.parsers import Content, ParserChoice, Reasoning, reasoning_parser_class
from tests.helpers import scripted_tool_server


def split(text: str, cuts: list[int], thinking: bool = False) -> tuple[str, str]:
    parser = reasoning_parser_class("think")(thinking)
    bounds = [0, *sorted(set(cuts)), len(text)]
    deltas = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        deltas += parser.feed(text[a:b])
    deltas += parser.finish()
    reasoning = "".join(d.text for d in deltas if isinstance(d, Reasoning))
    content = "".join(d.text for d in deltas if isinstance(d, Content))
    return reasoning, content


CASES = [
    # (text, prompt opened the channel, reasoning, content)
    ("<think>\nPlan.\n</think>\n\nAnswer.", False, "\nPlan.\n", "Answer."),
    ("Plan first.</think>Answer.", True, "Plan first.", "Answer."),
    ("Answer without thinking.", False, "", "Answer without thinking."),
    ("Cut off while still thinking", True, "Cut off while still thinking", ""),
    ("a < b, <thin and </thinking> are text", False, "", "a < b, <thin and </thinking> are text"),
    ("<think></think>Direct.", False, "", "Direct."),
]


@pytest.mark.parametrize(("text", "thinking", "reasoning", "content"), CASES)
def test_think_split(text: str, thinking: bool, reasoning: str, content: str) -> None:
    assert split(text, [], thinking) == (reasoning, content)
    assert split(text, list(range(1, len(text))), thinking) == (reasoning, content)


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_any_chunking_matches_whole(data: st.DataObject) -> None:
    text, thinking, reasoning, content = data.draw(st.sampled_from(CASES))
    cuts = data.draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=10))
    assert split(text, cuts, thinking) == (reasoning, content)


def lp(i: int) -> tuple[TokenLogprob, ...]:
    return (TokenLogprob(id=i, logprob=-1.0),)


def test_turn_parser_reasoning_then_call_with_logprobs() -> None:
    """Reasoning first, then a tool call; each token's logprob rides the next
    event that can carry it, in order, and none is lost."""
    tools = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)
    parser = TurnParser(TurnOptions(tools=tools), ParserChoice("hermes", "think"), thinking=True)
    events = []
    pieces = [
        "Hmm",
        "</think>",
        "\n\n",
        "<tool_call>",
        '{"name": "f", ',
        '"arguments": {}}',
        "</tool_call>",
    ]
    for i, piece in enumerate(pieces):
        events += parser.feed(piece, lp(i))
    events += parser.finish()
    assert [type(e) for e in events] == [
        ReasoningDelta,
        ToolCallStart,
        ToolCallArguments,
        TextDelta,
    ]
    assert events[0] == ReasoningDelta("Hmm", lp(0))
    assert (events[1].index, events[1].name) == (0, "f")
    assert events[2] == ToolCallArguments(0, "{}", lp(1) + lp(2) + lp(3) + lp(4) + lp(5))
    assert events[3] == TextDelta("", lp(6))
    assert parser.finish_reason("stop") == "tool_calls"
    assert parser.finish_reason("length") == "length"


@pytest.mark.parametrize(
    ("body", "template", "kwargs"),
    [
        ({}, "", None),
        ({"reasoning_effort": "none"}, "", {"enable_thinking": False}),
        ({"reasoning_effort": "low"}, "", {"enable_thinking": True}),
        (
            {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}},
            "",
            {"enable_thinking": True},
        ),
        (
            {"reasoning_effort": "high"},
            "{{ reasoning_effort }}",
            {"enable_thinking": True, "reasoning_effort": "high"},
        ),
        ({"chat_template_kwargs": {"x": 1}}, "", {"x": 1}),
    ],
)
def test_template_kwargs(body: dict, template: str, kwargs: dict | None) -> None:
    assert template_kwargs(body, template) == kwargs


def test_reasoning_alias_in_history() -> None:
    messages = [
        {"role": "assistant", "content": "a", "reasoning": "r"},
        {"role": "assistant", "content": "b", "reasoning": "r", "reasoning_content": ""},
    ]
    out = normalize_messages(messages, "m")
    assert out[0]["reasoning_content"] == "r"
    assert out[1]["reasoning_content"] == ""  # explicit, even empty, wins
    assert messages[0] == {"role": "assistant", "content": "a", "reasoning": "r"}


@pytest.fixture(scope="module")
def think(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with scripted_tool_server(tmp_path_factory.mktemp("think") / "m", "think") as (engine, server):
        with checking_client(server.base, timeout=30) as client:
            yield engine, client


ASK = [{"role": "user", "content": "2+2?"}]


def test_reasoning_non_stream(think: Any) -> None:
    engine, client = think
    engine.script = ["Add", " them.", "</think>", "\n\n", "4"]
    r = client.post("/v1/chat/completions", json={"messages": ASK})
    assert engine.prompts[-1].endswith("<|im_start|>assistant\n<think>\n")
    assert r.json()["choices"][0]["message"] == {
        "role": "assistant",
        "content": "4",
        "reasoning": "Add them.",
    }


def test_reasoning_stream_deltas(think: Any) -> None:
    engine, client = think
    engine.script = ["Add", " them.", "</think>", "\n\n", "4"]
    body = {"messages": ASK, "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body) as r:
        import json

        chunks = [json.loads(x[6:]) for x in r.iter_lines() if x.startswith("data: {")]
    assert [c["choices"][0]["delta"] for c in chunks] == [
        {"role": "assistant", "content": ""},
        {"reasoning": "Add"},
        {"reasoning": " them."},
        {"content": "4"},
        {},
    ]


def test_reasoning_effort_none_closes_the_channel(think: Any) -> None:
    engine, client = think
    engine.script = ["4"]
    r = client.post("/v1/chat/completions", json={"messages": ASK, "reasoning_effort": "none"})
    assert engine.prompts[-1].endswith("assistant\n<think>\n\n</think>\n\n")
    assert r.json()["choices"][0]["message"] == {"role": "assistant", "content": "4"}


def test_reasoning_history_renders(think: Any) -> None:
    engine, client = think
    engine.script = ["ok"]
    messages = [*ASK, {"role": "assistant", "content": "4", "reasoning": "sum"}, *ASK]
    client.post("/v1/chat/completions", json={"messages": messages})
    assert "<|im_start|>assistant\n<think>\nsum\n</think>\n\n4<|im_end|>" in engine.prompts[-1]


def test_reasoning_effort_invalid_is_400(think: Any) -> None:
    _, client = think
    r = client.post("/v1/chat/completions", json={"messages": ASK, "reasoning_effort": "max"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == (
        "reasoning_effort must be one of 'none', 'minimal', 'low', 'medium', 'high', 'xhigh'"
    )


TURN_TEXT = (
    "Weigh it.</think>\n\nChecking.<tool_call>\n"
    '{"name": "f", "arguments": {"q": "a\\u00e9\\"b"}}\n</tool_call>\n'
    '<tool_call>{"name": "g", "arguments": {}}</tool_call>'
)


def collect(cuts: list[int], parallel: bool = True) -> dict[str, Any]:
    """Run :class:`TurnParser` over ``TURN_TEXT`` split at ``cuts`` (one fake
    token per chunk) and gather what a client would see."""
    tools = tuple(
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in ("f", "g")
    )
    options = TurnOptions(tools=tools, parallel_tool_calls=parallel)
    parser = TurnParser(options, ParserChoice("hermes", "think"), thinking=True)
    bounds = [0, *sorted(set(cuts)), len(TURN_TEXT)]
    events = []
    for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)):
        events += parser.feed(TURN_TEXT[a:b], lp(i))
    events += parser.finish()
    out: dict[str, Any] = {"content": "", "reasoning": "", "calls": {}, "logprobs": []}
    for e in events:
        if isinstance(e, TextDelta):
            out["content"] += e.text
        elif isinstance(e, ReasoningDelta):
            out["reasoning"] += e.text
        elif isinstance(e, ToolCallStart):
            out["calls"][e.index] = [e.name, ""]
        elif isinstance(e, ToolCallArguments):
            out["calls"][e.index][1] += e.fragment
        out["logprobs"] += [x.id for x in getattr(e, "logprobs", ())]
    out["tokens"] = len(bounds) - 1
    return out


@settings(max_examples=150, deadline=None)
@given(cuts=st.lists(st.integers(1, len(TURN_TEXT) - 1), max_size=20))
def test_turn_any_chunking(cuts: list[int]) -> None:
    """Reasoning, content, calls and every token's logprob, whatever the chunking."""
    got = collect(cuts)
    assert got["logprobs"] == list(range(got.pop("tokens")))
    assert got == {
        "content": "Checking.",
        "reasoning": "Weigh it.",
        "calls": {0: ["f", '{"q": "aé\\"b"}'], 1: ["g", "{}"]},
        "logprobs": got["logprobs"],
    }


def test_turn_parallel_false_drops_later_calls_but_keeps_logprobs() -> None:
    got = collect(list(range(1, len(TURN_TEXT))), parallel=False)
    assert got["calls"] == {0: ["f", '{"q": "aé\\"b"}']}
    assert got["logprobs"] == list(range(got["tokens"]))

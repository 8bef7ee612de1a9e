"""Tool-call parsers on text: exact calls, any chunking, repair, schema decoding,
detection and the forcing grammars (pure tests, no model)."""

from __future__ import annotations

import json
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxspec.parsers import (
    CallArguments,
    CallBegin,
    CallEnd,
    Content,
    ParserChoice,
    detect,
    tool_parser_class,
)
from mlxspec.parsers.args import ArgumentsWriter, decode_value, repair_json
from mlxspec.parsers.forcing import tool_call_constraint

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
                "tags": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["city"],
        },
    },
}
TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
TOOLS = [WEATHER, TIME]


def run(name: str, text: str, cuts: list[int] | None = None) -> dict[str, Any]:
    """Feed ``text`` split at ``cuts`` and summarise the deltas: content, calls
    (name and joined arguments) and the delta order."""
    parser = tool_parser_class(name)(TOOLS)
    bounds = [0, *sorted(set(cuts or [])), len(text)]
    deltas = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        deltas += parser.feed(text[a:b])
    deltas += parser.finish()
    content, calls, open_call = "", [], False
    for d in deltas:
        if isinstance(d, Content):
            content += d.text
        elif isinstance(d, CallBegin):
            assert not open_call, "a call began inside another"
            calls.append({"name": d.name, "arguments": ""})
            open_call = True
        elif isinstance(d, CallArguments):
            assert open_call, "arguments outside a call"
            calls[-1]["arguments"] += d.fragment
        elif isinstance(d, CallEnd):
            open_call = False
    assert not open_call, "a call was never ended"
    return {"content": content, "calls": calls}


def call(name: str, **arguments: Any) -> dict[str, str]:
    return {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}


class ParserCases:
    """Shared cases: each subclass names a format and lists (text, content, calls)."""

    parser: ClassVar[str]
    cases: ClassVar[list[tuple[str, str, list[dict[str, str]]]]]

    def test_whole_text(self) -> None:
        for text, content, calls in self.cases:
            assert run(self.parser, text) == {"content": content, "calls": calls}, text

    def test_one_character_at_a_time(self) -> None:
        for text, content, calls in self.cases:
            cuts = list(range(1, len(text)))
            assert run(self.parser, text, cuts) == {"content": content, "calls": calls}, text

    def test_arguments_are_json_objects(self) -> None:
        for text, _, _ in self.cases:
            for c in run(self.parser, text)["calls"]:
                assert isinstance(json.loads(c["arguments"]), dict)


class TestHermes(ParserCases):
    parser = "hermes"
    cases: ClassVar = [
        (
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "days": 3}}\n</tool_call>',
            "Let me check.\n",
            [call("get_weather", city="Paris", days=3)],
        ),
        (  # parallel calls; whitespace between them is not content
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Zürich \\"Z\\"\\n"}}'
            '</tool_call>\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>\n',
            "",
            [call("get_weather", city='Zürich "Z"\n'), call("get_time")],
        ),
        (  # schema decoding: "3" for an integer, "true" for a boolean; strings stay
            '<tool_call>{"name": "get_weather", "arguments": {"city": "42", "days": "3", '
            '"metric": "true", "tags": "[\\"a\\"]"}}</tool_call>',
            "",
            [call("get_weather", city="42", days=3, metric=True, tags=["a"])],
        ),
        (  # repair: Python literals outside strings, single quotes, trailing comma
            "<tool_call>{'name': 'get_weather', 'arguments': {'city': 'True', "
            "'metric': False,}}</tool_call>",
            "",
            [call("get_weather", city="True", metric=False)],
        ),
        (  # repair: a fence inside the tags
            '<tool_call>```json\n{"name": "get_time", "arguments": {}}\n```</tool_call>',
            "",
            [call("get_time")],
        ),
        (  # cut off: braces closed
            '<tool_call>{"name": "get_weather", "arguments": {"city": "Par',
            "",
            [call("get_weather", city="Par")],
        ),
        (  # arguments as a JSON string
            '<tool_call>{"name": "get_weather", '
            '"arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>',
            "",
            [call("get_weather", city="Oslo")],
        ),
        (  # a name that landed inside the arguments is lifted out
            '<tool_call>{"arguments": {"name": "get_time"}}</tool_call>',
            "",
            [call("get_time")],
        ),
        (  # nested values complete only at their closing bracket
            '<tool_call>{"name": "get_weather", "arguments": {"tags": ["a", "]}", "b"], '
            '"days": 10}}</tool_call>',
            "",
            [call("get_weather", tags=["a", "]}", "b"], days=10)],
        ),
        (  # what models get wrong in strings: invalid escapes, raw newlines
            '<tool_call>{"name": "get_weather", "arguments": {"city": "C:\\dir\\new\\\\x", '
            '"tags": ["a\nb"]}}</tool_call>',
            "",
            [call("get_weather", city="C:\\dir\new\\x", tags=["a\nb"])],
        ),
        (  # escaped surrogate pairs join; a lone one stays an escape
            '<tool_call>{"name": "get_weather", "arguments": {"city": "\\ud83d\\ude00 '
            '\\ud83d!"}}</tool_call>',
            "",
            [{"name": "get_weather", "arguments": '{"city": "\U0001f600 \\ud83d!"}'}],
        ),
        (  # unparseable markup falls back to content
            "<tool_call>not a call</tool_call> ok",
            "<tool_call>not a call</tool_call> ok",
            [],
        ),
        ("No tools needed, <tool_ a partial tag.", "No tools needed, <tool_ a partial tag.", []),
    ]


class TestQwenXml(ParserCases):
    parser = "qwen3_coder"
    cases: ClassVar = [
        (
            "Checking.<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n"
            "</parameter>\n<parameter=days>\n2\n</parameter>\n<parameter=tags>\n"
            '["x", "y"]\n</parameter>\n</function>\n</tool_call>',
            "Checking.",
            [call("get_weather", city="New\nYork", days=2, tags=["x", "y"])],
        ),
        (  # raw text kept: entities, indentation, escapes; one framing newline only
            "<tool_call>\n<function=get_weather>\n<parameter=city>\n\n  a &amp; b \\n\n\n"
            "</parameter>\n</function>\n</tool_call>",
            "",
            [call("get_weather", city="\n  a &amp; b \\n\n")],
        ),
        (  # missing </parameter>, two calls
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nRome\n</function>\n"
            "</tool_call>\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>",
            "",
            [call("get_weather", city="Rome"), call("get_time")],
        ),
        (  # cut off inside a value
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nLim",
            "",
            [call("get_weather", city="Lim")],
        ),
    ]


class TestMistral(ParserCases):
    parser = "mistral"
    cases: ClassVar = [
        (
            '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}, '
            '{"name": "get_time", "arguments": {}}]',
            "",
            [call("get_weather", city="Paris"), call("get_time")],
        ),
        (
            'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Lyon", "days": 1}',
            "Sure. ",
            [call("get_weather", city="Lyon", days=1)],
        ),
        ("Plain [TOOL answer.", "Plain [TOOL answer.", []),
    ]


class TestLlama3Json(ParserCases):
    parser = "llama3_json"
    cases: ClassVar = [
        (
            '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}',
            "",
            [call("get_weather", city="Oslo")],
        ),
        (
            '{"name": "get_weather", "parameters": {"city": "A"}}; '
            '{"name": "get_time", "parameters": {}}',
            "",
            [call("get_weather", city="A"), call("get_time")],
        ),
        ('{"answer": 42}', '{"answer": 42}', []),
        ('The JSON {"name": "x"} is text here.', 'The JSON {"name": "x"} is text here.', []),
    ]


class TestPythonic(ParserCases):
    parser = "pythonic"
    cases: ClassVar = [
        (
            'Ok <|tool_call_start|>[get_weather(city="Paris", days=2), get_time()]'
            "<|tool_call_end|>",
            "Ok ",
            [call("get_weather", city="Paris", days=2), call("get_time")],
        ),
    ]


ALL_CASES = [
    (cls.parser, *case)
    for cls in (TestHermes, TestQwenXml, TestMistral, TestLlama3Json, TestPythonic)
    for case in cls.cases
]


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_any_chunking_matches_whole(data: st.DataObject) -> None:
    """The property: for any chunking of the model's text, the joined deltas
    equal the whole-text result (vLLM ``tests/tool_parsers/common_tests.py``)."""
    parser, text, content, calls = data.draw(st.sampled_from(ALL_CASES))
    cuts = data.draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=12))
    assert run(parser, text, cuts) == {"content": content, "calls": calls}


#: Fragments of markup, recombined at random: deep parser states, broken
#: escapes and stray tags that no hand-written case covers.
SOUP = [
    '<tool_call>{"name": "get_weather", "arguments": {"city": "',
    "<tool_call>\n<function=get_weather>\n<parameter=days>\n",
    '[TOOL_CALLS][{"name": "get_time", "arguments": {"tags": [',
    "<|tool_call_start|>[get_weather(city=",
    *("<tool_call>", "</tool_call>", "</parameter>", "</function>", "[ARGS]", ")]"),
    *("{", "}", "[", "]", '"', "'", ",", ":", ";", " ", "\n", "True", "1", "é"),
    *("\\ud83d", "\\ude00", "\\d", "\\n", '\\"', '"name"', '"get_weather"'),
]


@settings(max_examples=200, deadline=None)
@given(
    parser=st.sampled_from(["hermes", "qwen3_coder", "mistral", "llama3_json", "pythonic"]),
    pieces=st.lists(st.sampled_from(SOUP), max_size=25),
    data=st.data(),
)
def test_markup_soup_never_raises(parser: str, pieces: list[str], data: st.DataObject) -> None:
    """Any text parses without an exception, to valid JSON arguments, the
    same way for any chunking."""
    text = "".join(pieces)
    whole = run(parser, text)
    for c in whole["calls"]:
        assert isinstance(json.loads(c["arguments"]), dict)
        c["arguments"].encode()  # always valid UTF-8 (no lone surrogates)
    cuts = data.draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=10))
    assert run(parser, text, cuts) == whole


def test_streaming_is_incremental() -> None:
    """Arguments arrive while the model writes them, not at the closing tag."""
    parser = tool_parser_class("hermes")(TOOLS)
    early = parser.feed('<tool_call>{"name": "get_weather", "arguments": {"city": "Pa')
    assert early == [CallBegin("get_weather"), CallArguments('{"city": "'), CallArguments("Pa")]
    assert parser.feed('ris", "days": 4') == [CallArguments('ris"')]
    assert parser.feed("}}</tool_call>") == [
        CallArguments(', "days": 4'),
        CallArguments("}"),
        CallEnd(),
    ]


def test_long_arguments_are_linear() -> None:
    """A long non-string value is scanned once, not once per chunk."""
    import time

    items = ", ".join(f'"item {i}"' for i in range(20000))
    text = f'<tool_call>{{"name": "get_weather", "arguments": {{"tags": [{items}]}}}}</tool_call>'
    begin = time.perf_counter()
    result = run("hermes", text, list(range(4, len(text), 4)))
    assert time.perf_counter() - begin < 10
    assert json.loads(result["calls"][0]["arguments"]) == {
        "tags": [f"item {i}" for i in range(20000)]
    }


def test_writer_fragments_concatenate_to_json_dumps() -> None:
    writer = ArgumentsWriter()
    parts = [writer.member("a", [1, {"b": None}]), writer.open_string("s")]
    parts += [writer.string_chunk('x"\u00e9'), writer.string_chunk("\n"), writer.close_string()]
    parts.append(writer.close({"a": "ignored (already sent)", "z": 1.5}))
    expected = {"a": [1, {"b": None}], "s": 'x"\u00e9\n', "z": 1.5}
    assert "".join(parts) == json.dumps(expected, ensure_ascii=False)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ('```json\n{"a": 1}\n```', {"a": 1}),
        ('Here you go: {"a": [1, 2,],}', {"a": [1, 2]}),
        ("{'a': 'it\\'s', 'b': None, 'c': True}", {"a": "it's", "b": None, "c": True}),
        ('{"a": "True stays", "b": True}', {"a": "True stays", "b": True}),
        ('{"a": {"b": [1, "x', {"a": {"b": [1, "x"]}}),
        ("no json here", None),
    ],
)
def test_repair(text: str, value: Any) -> None:
    assert repair_json(text) == value


@pytest.mark.parametrize(
    ("value", "schema", "raw", "decoded"),
    [
        ("3", {"type": "integer"}, False, 3),
        ("3.0", {"type": "integer"}, False, 3),
        ("2.5", {"type": "number"}, False, 2.5),
        ("false", {"type": "boolean"}, False, False),
        ("3", {"type": "string"}, False, "3"),
        ('{"k": 1}', {"type": "object"}, False, {"k": 1}),
        ("{'k': True}", {"type": "object"}, False, {"k": True}),
        ("[1, 2]", None, True, [1, 2]),
        ("[1, 2]", None, False, "[1, 2]"),
        ("nope", {"type": "integer"}, False, "nope"),
        ("a", {"enum": ["a", "b"]}, False, "a"),
        (7, {"type": "string"}, False, 7),
    ],
)
def test_decode_value(value: Any, schema: Any, raw: bool, decoded: Any) -> None:
    assert decode_value(value, schema, raw) == decoded


class _Tok:
    def __init__(self, template: str, **extra: Any) -> None:
        self.chat_template = template
        self.__dict__.update(extra)


@pytest.mark.parametrize(
    ("template", "choice"),
    [
        ("{{ '<tool_call>' }}{{ tool_call.name }}", ParserChoice("hermes")),
        ("<tool_call>\n<function={{ n }}><parameter=", ParserChoice("qwen3_coder")),
        ("[AVAILABLE_TOOLS][TOOL_CALLS]", ParserChoice("mistral")),
        ("<|python_tag|>{{ x }}", ParserChoice("llama3_json")),
        ("[func_name1(params_name1=params_value1)]", ParserChoice("pythonic_bare")),
        # templates that never read `tools` get the Hermes convention the prompt then uses
        ("<|im_start|>{{ m }}<think>", ParserChoice("hermes", "think")),
        ("plain {{ m }}", ParserChoice("hermes")),
        # a template that renders tools in a format we do not know is not parsed
        ("{% for t in tools %}{{ t }}{% endfor %}{{ m }}", ParserChoice()),
    ],
)
def test_detect_from_template(template: str, choice: ParserChoice) -> None:
    assert detect(_Tok(template)) == choice


def test_detect_prefers_mlx_lm_inference() -> None:
    from mlx_lm.tool_parsers import glm47, json_tools

    assert detect(_Tok("", tool_parser=json_tools.parse_tool_call)) == ParserChoice("hermes")
    tok = _Tok("<tool_call>", tool_parser=glm47.parse_tool_call, think_start="<think>")
    assert detect(tok) == ParserChoice("glm47", "think")


def test_mlx_lm_family_parser() -> None:
    """A family only mlx-lm knows is parsed by its own parser, markers included."""
    text = "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>"
    assert run("glm47", text) == {"content": "", "calls": [call("get_weather", city="Paris")]}


FORCED_CALLS = {
    "hermes": '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "</function>\n</tool_call>",
    "mistral": '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]',
    "llama3_json": '{"name": "get_weather", "parameters": {"city": "Paris"}}',
}


@pytest.mark.parametrize("parser", sorted(FORCED_CALLS))
def test_forcing_grammar_accepts_exactly_calls(parser: str) -> None:
    """The forced grammar accepts a call in the format (which the same parser
    reads back) and rejects plain text and unknown tools."""
    import xgrammar as xgr
    from xgrammar.testing import _is_grammar_accept_string as accepts

    constraint = tool_call_constraint(parser, [WEATHER], "required")
    assert constraint is not None and constraint.kind == "structural_tag"
    grammar = xgr.Grammar.from_structural_tag(constraint.spec)
    good = FORCED_CALLS[parser]
    assert accepts(grammar, good)
    assert not accepts(grammar, "Hello there")
    assert not accepts(grammar, good.replace("get_weather", "get_wether"))
    assert run(parser, good)["calls"] == [call("get_weather", city="Paris")]


def test_forcing_named_function_and_auto() -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    constraint = tool_call_constraint("hermes", TOOLS, named, parallel_tool_calls=False)
    assert constraint is not None
    assert json.loads(constraint.spec) == {
        "type": "structural_tag",
        "format": {
            "type": "tag",
            "begin": '<tool_call>\n{"name": "get_time", "arguments": ',
            "content": {
                "type": "json_schema",
                "json_schema": {"type": "object"},
                "style": "json",
                "any_order": False,
                "max_whitespace_cnt": 16,
                "excludes": [],
            },
            "end": "}\n</tool_call>",
        },
    }
    assert tool_call_constraint("hermes", TOOLS, "auto") is None
    assert tool_call_constraint("pythonic", TOOLS, "required") is None

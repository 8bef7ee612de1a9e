"""Structured output over HTTP: the wire fields -> Constraint mapping and its
precedence, the document's errors, enforcement on chat and text completions,
and the degrade path (``Warning`` header, system instruction) for grammars
that do not compile or are switched off with ``MLXSPEC_GRAMMAR=0``.

The tiny random model shows the mask at work (its own output is gibberish);
the real SmolLM2 model shows structured output a user would rely on
(``tests/real/test_structured_output.py``).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest

from mlxspec.cli.flags import parse_config
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.conformance.live import serve
from mlxspec.engine import Constraint
from mlxspec.handlers.requests import to_constraint
from mlxspec.handlers.turns.structured import degraded_body, instruction, warning_header
from tests.helpers import TINY_SCHEMA

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
USER = [{"role": "user", "content": "hi"}]
BAD_EBNF = "root ::= foo"
BAD_EBNF_WARNING = (
    'grammar not enforced: EBNF parser error at line 1, column 10: Rule "foo" is not defined'
)
DISABLED_WARNING = "grammar not enforced: grammar compilation disabled by MLXSPEC_GRAMMAR=0"


def schema_format(schema: dict, **extra: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, **extra}}


def sse_payloads(r: httpx.Response) -> list[dict]:
    lines = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


# ------------------------------------------------------- wire -> Constraint
SCHEMA_TEXT = '{"type": "object", "properties": {"b": {}, "a": {}}}'


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({}, None),
        ({"response_format": None}, None),
        ({"response_format": {"type": "text"}}, None),
        ({"response_format": {"type": "json_object"}}, Constraint("json_object")),
        (
            {"response_format": schema_format(json.loads(SCHEMA_TEXT), strict=True)},
            Constraint("json_schema", SCHEMA_TEXT),
        ),
        (
            {"response_format": schema_format({"type": "integer"}, any_whitespace=False)},
            Constraint("json_schema", '{"type": "integer"}', any_whitespace=False),
        ),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "any"}}},
            Constraint("json_schema", "{}"),
        ),
        ({"guided_grammar": 'root ::= "a"'}, Constraint("ebnf", 'root ::= "a"')),
        ({"guided_regex": "[a-z]+"}, Constraint("regex", "[a-z]+")),
        ({"guided_choice": ["yes", "né"]}, Constraint("choice", '["yes", "né"]')),
        (
            {"structured_outputs": {"type": "string"}},
            Constraint("json_schema", '{"type": "string"}'),
        ),
    ],
    ids=[
        "none",
        "null format",
        "text",
        "json_object",
        "json_schema keeps key order",
        "any_whitespace false",
        "schema omitted",
        "guided_grammar",
        "guided_regex",
        "guided_choice",
        "structured_outputs",
    ],
)
def test_to_constraint(body: dict, expected: Constraint | None) -> None:
    assert to_constraint(body) == expected


EVERYTHING = {
    "guided_grammar": 'root ::= "g"',
    "response_format": schema_format({"type": "string"}),
    "structured_outputs": {"type": "integer"},
    "guided_regex": "r+",
    "guided_choice": ["c"],
}


@pytest.mark.parametrize(
    ("drop", "expected"),
    [
        ((), Constraint("ebnf", 'root ::= "g"')),
        (("guided_grammar",), Constraint("json_schema", '{"type": "string"}')),
        (("guided_grammar", "response_format"), Constraint("json_schema", '{"type": "integer"}')),
        (("guided_grammar", "response_format", "structured_outputs"), Constraint("regex", "r+")),
        (
            ("guided_grammar", "response_format", "structured_outputs", "guided_regex"),
            Constraint("choice", '["c"]'),
        ),
    ],
)
def test_precedence(drop: tuple[str, ...], expected: Constraint) -> None:
    body = {k: v for k, v in EVERYTHING.items() if k not in drop}
    assert to_constraint(body) == expected


def test_json_object_wins_over_structured_outputs_and_text_is_no_constraint() -> None:
    body = {"response_format": {"type": "json_object"}, "structured_outputs": {"type": "string"}}
    assert to_constraint(body) == Constraint("json_object")
    body = {"response_format": {"type": "text"}, "guided_regex": "x"}
    assert to_constraint(body) == Constraint("regex", "x")


# ------------------------------------------------------ degrade path (pure)
def test_instructions_quote_the_constraint() -> None:
    assert instruction(Constraint("json_object")) == (
        "Reply with valid JSON only (an object or an array), and no other text."
    )
    assert instruction(Constraint("json_schema", '{"type": "string"}')) == (
        "Reply with JSON only, and no other text, that matches this JSON Schema:\n"
        '{"type": "string"}'
    )
    assert instruction(Constraint("regex", "a+")) == (
        "Reply only with text that fully matches this regular expression:\na+"
    )
    assert instruction(Constraint("ebnf", BAD_EBNF)) == (
        "Reply only with text that this EBNF grammar (start rule root) accepts:\nroot ::= foo"
    )
    assert instruction(Constraint("choice", '["yes", "no"]')) == (
        'Reply with exactly one of these options, unquoted, and nothing else:\n- "yes"\n- "no"'
    )


def test_degraded_chat_body_prepends_the_instruction() -> None:
    body = {"messages": USER, "guided_regex": "a+", "response_format": None, "max_tokens": 3}
    out = degraded_body(body, Constraint("regex", "a+"), chat=True)
    note = instruction(Constraint("regex", "a+"))
    assert out == {"messages": [{"role": "system", "content": note}, *USER], "max_tokens": 3}
    assert body["messages"] == USER  # the caller's body is not modified


def test_degraded_chat_body_joins_a_leading_system_message() -> None:
    system = {"role": "system", "content": "Be brief.", "name": "x"}
    out = degraded_body({"messages": [system, *USER]}, Constraint("json_object"), chat=True)
    note = instruction(Constraint("json_object"))
    expected = [{"role": "system", "content": f"{note}\n\nBe brief.", "name": "x"}, *USER]
    assert out == {"messages": expected}


def test_degraded_completion_body_only_drops_the_fields() -> None:
    body = {"prompt": "p", "guided_choice": ["a"], "structured_outputs": {}}
    assert degraded_body(body, Constraint("choice", '["a"]'), chat=False) == {"prompt": "p"}


def test_warning_header_is_one_ascii_line() -> None:
    assert warning_header("bad\n  rule «x»") == {
        "Warning": "grammar not enforced: bad rule \\xabx\\xbb"
    }
    long = warning_header("x" * 1000)["Warning"]
    assert len(long) == 400 and long.endswith("...")


# ---------------------------------------------------------- document errors
@pytest.mark.parametrize(
    ("path", "field", "value", "param", "message"),
    [
        (
            CHAT,
            "guided_choice",
            [],
            "guided_choice",
            "guided_choice must be a non-empty list of strings",
        ),
        (
            CHAT,
            "guided_choice",
            "yes",
            "guided_choice",
            "guided_choice must be a non-empty list of strings",
        ),
        (
            COMP,
            "guided_choice",
            ["a", 1],
            "guided_choice[1]",
            "guided_choice must be a non-empty list of strings",
        ),
        (CHAT, "guided_regex", 5, "guided_regex", "guided_regex must be a string"),
        (COMP, "guided_grammar", ["root"], "guided_grammar", "guided_grammar must be a string"),
        (
            CHAT,
            "structured_outputs",
            "schema",
            "structured_outputs",
            "structured_outputs must be a JSON schema object",
        ),
        (COMP, "response_format", "json", "response_format", "response_format must be an object"),
        (
            CHAT,
            "response_format",
            {"type": "xml"},
            "response_format.type",
            "response_format.type must be one of 'text', 'json_object', 'json_schema'",
        ),
        (
            COMP,
            "response_format",
            {"type": "json_schema", "json_schema": {"name": "x", "schema": []}},
            "response_format.json_schema.schema",
            "response_format.json_schema.schema must be a JSON schema object",
        ),
        (
            CHAT,
            "response_format",
            {"type": "json_schema"},
            "response_format.json_schema",
            "response_format.json_schema is required",
        ),
        (COMP, "response_format", {}, "response_format.type", "response_format.type is required"),
    ],
)
def test_malformed_fields_are_400(client, path, field, value, param, message) -> None:
    base = {"messages": USER} if path == CHAT else {"prompt": "hi"}
    r = client.post(path, json={**base, field: value, "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["message"]) == (param, message)


# ----------------------------------------------------- enforcement (tiny model)
def test_chat_json_schema_is_enforced(client) -> None:
    fmt = schema_format(TINY_SCHEMA, any_whitespace=False)
    r = client.post(CHAT, json={"messages": USER, "response_format": fmt, "max_tokens": 60})
    assert r.status_code == 200 and "warning" not in r.headers
    choice = r.json()["choices"][0]
    jsonschema.validate(json.loads(choice["message"]["content"]), TINY_SCHEMA)
    assert choice["finish_reason"] == "stop"


def test_chat_stream_is_enforced(client) -> None:
    body = {"messages": USER, "guided_regex": "[a-z]{4}[0-9]", "max_tokens": 20, "stream": True}
    r = client.post(CHAT, json=body)
    assert r.status_code == 200 and "warning" not in r.headers
    chunks = sse_payloads(r)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert re.fullmatch("[a-z]{4}[0-9]", text), text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_completion_choice_is_enforced(client) -> None:
    body = {"prompt": "hello", "guided_choice": ["alpha", "beta"], "max_tokens": 20}
    r = client.post(COMP, json=body)
    choice = r.json()["choices"][0]
    assert choice["text"] in ("alpha", "beta")
    assert choice["finish_reason"] == "stop"


def test_completion_grammar_stream_is_enforced(client) -> None:
    grammar = 'root ::= "<" [0-9] [0-9]? ">"'
    body = {"prompt": "hello", "guided_grammar": grammar, "max_tokens": 20, "stream": True}
    chunks = sse_payloads(client.post(COMP, json=body))
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert re.fullmatch("<[0-9][0-9]?>", text), text
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_every_choice_is_enforced(client) -> None:
    body = {
        "messages": USER,
        "guided_choice": ["red", "green", "blue"],
        "n": 3,
        "temperature": 1.0,
        "max_tokens": 10,
    }
    choices = client.post(CHAT, json=body).json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    for choice in choices:
        assert choice["message"]["content"] in ("red", "green", "blue")
        assert choice["finish_reason"] == "stop"


#: A seeded request using XTC runs on the serial lane (its coin comes from MLX's
#: global random stream).
SERIAL = {"seed": 7, "temperature": 0.7, "xtc_probability": 0.5, "xtc_threshold": 0.1}


@pytest.mark.parametrize("extra", [{}, SERIAL], ids=["batched", "serial"])
def test_grammar_is_enforced_after_a_prompt_cache_hit(client, extra) -> None:
    prompt = f"a prompt worth caching, {sorted(extra)}"
    body = {"prompt": prompt, "guided_regex": "[0-9]{3}", "max_tokens": 10, **extra}
    first, second = (client.post(COMP, json=body).json() for _ in range(2))
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert second["usage"]["lane"] == ("serial" if extra else "batched")
    for reply in (first, second):
        assert re.fullmatch("[0-9]{3}", reply["choices"][0]["text"])
        assert reply["choices"][0]["finish_reason"] == "stop"


# ------------------------------------------------ degrade path (tiny model)
def test_chat_bad_grammar_degrades_with_warning_and_instruction(client, tiny_engine) -> None:
    body = {"messages": USER, "guided_grammar": BAD_EBNF, "max_tokens": 3}
    r = client.post(CHAT, json=body)
    assert r.status_code == 200
    assert r.headers["warning"] == BAD_EBNF_WARNING
    note = instruction(Constraint("ebnf", BAD_EBNF))
    prompt = tiny_engine.chat_prompt([{"role": "system", "content": note}, *USER])
    assert r.json()["usage"]["prompt_tokens"] == len(prompt)


def test_chat_stream_bad_regex_degrades_with_warning(client, tiny_engine) -> None:
    body = {"messages": USER, "guided_regex": "(", "max_tokens": 3, "stream": True}
    r = client.post(CHAT, json={**body, "stream_options": {"include_usage": True}})
    assert r.status_code == 200
    assert r.headers["warning"] == (
        "grammar not enforced: Regex parsing error at position 2: The parenthesis is not closed."
    )
    note = instruction(Constraint("regex", "("))
    prompt = tiny_engine.chat_prompt([{"role": "system", "content": note}, *USER])
    assert sse_payloads(r)[-1]["usage"]["prompt_tokens"] == len(prompt)


def test_grammar_that_crashes_the_compiler_degrades(client) -> None:
    body = {"messages": USER, "guided_grammar": "root ::= root{2,}", "max_tokens": 2}
    r = client.post(CHAT, json=body)
    assert r.status_code == 200
    assert r.headers["warning"] == (
        "grammar not enforced: the grammar compiler crashed on this grammar"
    )
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_completion_bad_grammar_sends_the_header_only(client, tiny_engine, stream) -> None:
    body = {"prompt": "hello", "guided_grammar": BAD_EBNF, "max_tokens": 3, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    r = client.post(COMP, json=body)
    assert r.status_code == 200
    assert r.headers["warning"] == BAD_EBNF_WARNING
    usage = sse_payloads(r)[-1]["usage"] if stream else r.json()["usage"]
    assert usage["prompt_tokens"] == len(tiny_engine.text_prompt("hello"))


def test_grammar_env_switch_parses_at_the_edge(monkeypatch) -> None:
    monkeypatch.setenv("MLXSPEC_GRAMMAR", "0")
    assert parse_config(["serve"]).grammar is False
    monkeypatch.setenv("MLXSPEC_GRAMMAR", "1")
    assert parse_config(["serve"]).grammar is True
    monkeypatch.delenv("MLXSPEC_GRAMMAR")
    assert parse_config(["serve"]).grammar is True


@pytest.fixture(scope="module")
def grammar_off(tiny_model_dir: Path, tmp_path_factory) -> Iterator[httpx.Client]:
    """``MLXSPEC_GRAMMAR=0 mlxspec serve <tiny model>`` in a subprocess."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_GRAMMAR": "0"}
    argv = [sys.executable, "-m", "mlxspec", "serve", str(tiny_model_dir), "--port", "{port}"]
    log = tmp_path_factory.mktemp("grammar-off") / "serve.log"
    with serve(argv, env, log, timeout=120) as base, checking_client(base, timeout=60) as c:
        yield c


def test_grammar_disabled_degrades_every_constraint(grammar_off, tiny_engine) -> None:
    fmt = {"type": "json_object"}
    r = grammar_off.post(CHAT, json={"messages": USER, "response_format": fmt, "max_tokens": 3})
    assert r.status_code == 200
    assert r.headers["warning"] == DISABLED_WARNING
    note = instruction(Constraint("json_object"))
    prompt = tiny_engine.chat_prompt([{"role": "system", "content": note}, *USER])
    assert r.json()["usage"]["prompt_tokens"] == len(prompt)
    body = {"prompt": "hi", "guided_choice": ["a"], "max_tokens": 3, "stream": True}
    r = grammar_off.post(COMP, json=body)
    assert r.headers["warning"] == DISABLED_WARNING
    r = grammar_off.post(CHAT, json={"messages": USER, "max_tokens": 2})
    assert "warning" not in r.headers


# ---------------------------------------------------------------- document
def test_document_declares_the_fields_on_both_routes_and_the_warning() -> None:
    from mlxspec.openapi import load_spec

    spec = load_spec()
    schemas = spec["components"]["schemas"]
    for name in ("CreateChatCompletionRequest", "CreateCompletionRequest"):
        refs = [entry.get("$ref") for entry in schemas[name]["allOf"]]
        assert "#/components/schemas/StructuredOutputParameters" in refs, name
    fields = schemas["StructuredOutputParameters"]["properties"]
    assert sorted(fields) == sorted(
        ["response_format", "guided_grammar", "guided_regex", "guided_choice", "structured_outputs"]
    )
    extensions = sorted(k for k, v in fields.items() if v.get("x-mlxspec-extension"))
    assert extensions == ["guided_choice", "guided_grammar", "guided_regex", "structured_outputs"]
    # No `default`: Connexion would inject it and hide that the client omitted a field.
    stack: list = [schemas["StructuredOutputParameters"], schemas["ResponseFormat"]]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            assert "default" not in node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    for path in (CHAT, COMP):
        headers = spec["paths"][path]["post"]["responses"]["200"]["headers"]
        assert headers["Warning"] == {"$ref": "#/components/headers/GrammarWarning"}

"""``POST /v1/responses/input_tokens`` (OpenAI's ``responses.input_tokens.count``):
the prompt length ``POST /v1/responses`` would run for the same body, with the
same ``previous_response_id`` conversation, and no generation.

Each count is checked against the ``input_tokens`` of a real response to the
same body (the tiny random model, greedy, EOS forbidden), through the official
``openai`` SDK; the ``sdk`` and ``client`` fixtures check every response
against the document.
"""

from __future__ import annotations

import re

import httpx
import openai
import pytest

NO_EOS = {"logit_bias": {"2": -1e9}}
FIXED = {"model": "any", "max_output_tokens": 4, "temperature": 0}
#: Short: the tiny model's template describes tools in its system message,
#: and its window is 256 tokens.
WEATHER = {"type": "function", "name": "w", "parameters": {"type": "object"}}
BAD = {"type": "foo"}  # no JSON Schema type: the grammar does not compile
LOOKBEHIND = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(?<=x)y"}}}


@pytest.mark.parametrize(
    "fields",
    [
        {"input": "hello there"},
        {"input": "hello", "instructions": "Be brief."},
        {
            "input": [
                {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
            ]
        },
        {"input": "hi", "tools": [WEATHER]},
        # a schema xgrammar refuses: the degrade path's system instruction is counted
        {"input": "hi", "text": {"format": {"type": "json_schema", "name": "a", "schema": BAD}}},
    ],
    ids=["text", "instructions", "items", "tools", "degraded-format"],
)
def test_count_is_the_prompt_a_response_runs(sdk: openai.OpenAI, fields: dict) -> None:
    counted = sdk.responses.input_tokens.count(model="any", **fields)
    assert counted.object == "response.input_tokens"
    created = sdk.responses.create(**FIXED, extra_body=NO_EOS, **fields)
    assert counted.input_tokens == created.usage.input_tokens > 0


def test_count_includes_a_degraded_forced_call_instruction(sdk: openai.OpenAI) -> None:
    # A forced call whose parameters xgrammar refuses is asked for in a system
    # instruction; with it the prompt outgrows the tiny model's 256-token window,
    # so the create's own 400 states the length the count must give.
    fields = {"input": "hi", "tools": [{**WEATHER, "parameters": LOOKBEHIND}]}
    counted = sdk.responses.input_tokens.count(model="any", tool_choice="required", **fields)
    unforced = sdk.responses.input_tokens.count(model="any", **fields)
    with pytest.raises(openai.BadRequestError) as err:
        sdk.responses.create(**FIXED, extra_body=NO_EOS, tool_choice="required", **fields)
    said = re.search(r"the prompt has (\d+) tokens", err.value.message)
    assert said is not None and counted.input_tokens == int(said[1]) > unforced.input_tokens


def test_count_follows_previous_response_id(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(**FIXED, extra_body=NO_EOS, input="hello", instructions="Hi.")
    fields = {"input": "and again", "previous_response_id": first.id}
    counted = sdk.responses.input_tokens.count(model="any", **fields)
    second = sdk.responses.create(**FIXED, extra_body=NO_EOS, **fields)
    assert counted.input_tokens == second.usage.input_tokens
    # the previous turn is in the count: more than the new input alone
    alone = sdk.responses.input_tokens.count(model="any", input="and again", instructions="Hi.")
    assert counted.input_tokens > alone.input_tokens


def test_count_generates_nothing(sdk: openai.OpenAI, tiny_engine) -> None:
    before = tiny_engine.submitted
    sdk.responses.input_tokens.count(model="any", input="hello")
    assert tiny_engine.submitted == before


def test_errors(client: httpx.Client) -> None:
    route = "/v1/responses/input_tokens"
    r = client.post(route, json={"previous_response_id": "resp_missing", "input": "x"})
    assert r.status_code == 404
    assert r.json()["error"]["param"] == "previous_response_id"
    r = client.post(route, json={"model": "any"})
    assert (r.status_code, r.json()["error"]["message"]) == (
        400,
        "input is required unless previous_response_id is given",
    )
    # the concrete path wins over /v1/responses/{response_id} (OpenAPI 3.1 path
    # matching): GET and DELETE here are not a lookup of response "input_tokens"
    for method in ("GET", "DELETE"):
        r = client.request(method, route)
        assert (r.status_code, r.headers["allow"]) == (405, "POST")
        assert r.json()["error"]["message"] == "method not allowed"
    assert client.get("/v1/responses/resp_unknown").status_code == 404

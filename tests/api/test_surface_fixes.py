"""What a fresh user of the OpenAI surface found (issue #4 follow-up), pinned.

Tool history on a template that ignores ``tools``; the leading space of a raw
text completion; numbers that overflow a double; a budget-cut tool call's
``content``. Tiny random models and the scripted engine throughout (exact
values); the real SmolLM2 once, where the text must mean something
(``tests/real/test_completions.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from tests.helpers import scripted_tool_server

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
SPACE_T = 262  # the tiny model's merged token "Ġt", i.e. " t"
FORCE_SPACE_T = {str(SPACE_T): 100}
GET_TIME = {
    "type": "function",
    "function": {"name": "get_time", "parameters": {"type": "object"}},
}
TOOL_HISTORY = [
    {"role": "user", "content": "What time is it?"},
    {
        "role": "assistant",
        "tool_calls": [
            {
                "id": "a",
                "type": "function",
                "function": {"name": "get_time", "arguments": '{"tz": "UTC"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "a", "content": "12:00"},
]
INSTRUCTION = (
    'Functions you may call:\n[{"name":"get_time","parameters":{"type":"object"}}]\n'
    'To call one, reply <tool_call>{"name":...,"arguments":{...}}</tool_call>'
)


# --- 1. tool history on a template that ignores tools --------------------------


def test_tool_history_renders_in_the_instruction_syntax(tiny_engine) -> None:
    text = tiny_engine.tokenizer.decode(tiny_engine.chat_prompt(TOOL_HISTORY, [GET_TIME]))
    assert text == (
        f"<|im_start|>system\n{INSTRUCTION}<|im_end|>\n"
        "<|im_start|>user\nWhat time is it?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_text_then_parallel_calls_and_their_results_share_turns(tiny_engine) -> None:
    def call(i: str, args: str) -> dict:
        return {"id": i, "type": "function", "function": {"name": "get_time", "arguments": args}}

    messages = [
        {"role": "user", "content": "Time in UTC and CET?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [call("a", '{"tz": "UTC"}'), call("b", "")],
        },
        {"role": "tool", "tool_call_id": "a", "content": "12:00"},
        {"role": "tool", "tool_call_id": "b", "content": "13:00"},
        {"role": "assistant", "content": "12:00 and 13:00."},
    ]
    # Without tools in this request (tool_choice "none" drops them) the calls still render.
    text = tiny_engine.tokenizer.decode(tiny_engine.chat_prompt(messages))
    assert text == (
        "<|im_start|>user\nTime in UTC and CET?<|im_end|>\n"
        "<|im_start|>assistant\nChecking.\n"
        '<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>\n'
        '<tool_call>{"name": "get_time", "arguments": {}}</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n12:00\n</tool_response>\n"
        "<tool_response>\n13:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n12:00 and 13:00.<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_template_that_renders_tools_gets_the_history_as_is(tmp_path: Path) -> None:
    """The Hermes (Qwen 2.5) fixture template writes calls and results itself."""
    with scripted_tool_server(tmp_path / "hermes", "hermes") as (engine, server):
        engine.script = ["It is noon."]
        with checking_client(server.base, timeout=60) as client:
            body = {"messages": TOOL_HISTORY, "tools": [GET_TIME]}
            assert client.post(CHAT, json=body).status_code == 200
    prompt = engine.prompts[-1]
    assert "Functions you may call" not in prompt
    assert prompt.endswith(
        "<|im_start|>user\nWhat time is it?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}'
        "\n</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n12:00\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


# --- 2. raw text completions keep their leading space --------------------------


def _stream_text(r: httpx.Response) -> tuple[str, list[str], list[int]]:
    text, tokens, offsets = "", [], []
    for line in r.text.split("\n"):
        if line.startswith("data: {"):
            choice = json.loads(line[6:])["choices"][0]
            text += choice["text"]
            if choice["logprobs"]:
                tokens += choice["logprobs"]["tokens"]
                offsets += choice["logprobs"]["text_offset"]
    return text, tokens, offsets


def test_completion_keeps_the_leading_space(oclient: httpx.Client, client: httpx.Client) -> None:
    body = {"prompt": "hello", "max_tokens": 2, "logprobs": True, "logit_bias": FORCE_SPACE_T}
    choice = oclient.post(COMP, json=body).json()["choices"][0]
    assert choice["text"] == " t t"
    assert choice["logprobs"]["tokens"] == [" t", " t"]
    assert choice["logprobs"]["text_offset"] == [0, 2]
    streamed = oclient.post(COMP, json={**body, "stream": True})
    assert _stream_text(streamed) == (" t t", [" t", " t"], [0, 2])
    # The default format and n > 1 keep it too.
    many = client.post(COMP, json={**body, "n": 2}).json()["choices"]
    assert [c["text"] for c in many] == [" t t", " t t"]
    # A chat reply still starts without it (mlx-lm's answer convention).
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    reply = client.post(CHAT, json={**chat, "logit_bias": FORCE_SPACE_T}).json()
    assert reply["choices"][0]["message"]["content"] == "t t"


# --- 3. numbers that overflow a double ---------------------------------------------

MESSAGES = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    "field",
    [
        '"temperature": 1e400',
        '"logit_bias": {"5": 1e400}',
        '"presence_penalty": 1e400',
        '"frequency_penalty": -1e309',
        '"repetition_penalty": ' + "9" * 400,
    ],
)
def test_overflowing_numbers_are_invalid_json_on_openai(client: httpx.Client, field: str) -> None:
    raw = '{"messages": [{"role": "user", "content": "hi"}], ' + field + "}"
    r = client.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "invalid JSON body: number out of range",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_json",
        }
    }


def test_overflowing_numbers_in_each_surface_envelope(client: httpx.Client) -> None:
    h = {"content-type": "application/json"}
    r = client.post(COMP, content=b'{"prompt": "hi", "temperature": 1e400}', headers=h)
    assert (r.status_code, r.json()["error"]["message"]) == (
        400,
        "invalid JSON body: number out of range",
    )
    raw = b'{"model": "m", "max_tokens": 1, "temperature": -1e400, "messages": []}'
    r = client.post("/v1/messages", content=raw, headers=h)
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "invalid JSON body: number out of range",
        },
    }
    # System One answers invalid JSON as FastAPI does: 422 with a detail list.
    raw = b'{"model": "m", "state": "late", "questions": {}, "temperature": 1e999}'
    r = client.post("/v1/systemone", content=raw, headers=h)
    assert r.status_code == 422
    assert r.json() == {
        "detail": [
            {
                "loc": ["body"],
                "msg": "invalid JSON body: number out of range",
                "type": "value_error",
            }
        ]
    }


def test_finite_extremes_parse(client: httpx.Client) -> None:
    """The largest finite values are JSON: an uncapped field takes them, a ranged
    one names its range (tests/test_float_ranges.py), neither is invalid JSON."""
    head = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1'
    h = {"content-type": "application/json"}
    r = client.post(CHAT, content=head + ', "temperature": 1e308}', headers=h)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1
    r = client.post(CHAT, content=head + ', "presence_penalty": 1e308}', headers=h)
    assert (r.status_code, r.json()["error"]["message"]) == (
        400,
        "presence_penalty must be between -2 and 2",
    )


# --- 5. a tool call cut by the budget, with no text ------------------------------


def test_cut_call_without_text_is_empty_content(tmp_path: Path) -> None:
    with scripted_tool_server(tmp_path / "hermes", "hermes") as (engine, server):
        engine.finish_reason = "length"
        engine.script = ["<tool_call>", '\n{"name": "get_time", "argu']
        with checking_client(server.base, timeout=60) as client:
            body = {"messages": TOOL_HISTORY[:1], "tools": [GET_TIME], "max_tokens": 2}
            chat = client.post(CHAT, json=body).json()
            anthropic_body = {
                "model": "m",
                "max_tokens": 2,
                "messages": TOOL_HISTORY[:1],
                "tools": [{"name": "get_time", "input_schema": {"type": "object"}}],
            }
            message = client.post("/v1/messages", json=anthropic_body).json()
    assert chat["choices"][0]["message"] == {"role": "assistant", "content": ""}
    assert chat["choices"][0]["finish_reason"] == "length"
    # Anthropic: no tool_use block and no empty text block, as before.
    assert (message["content"], message["stop_reason"]) == ([], "max_tokens")

"""Tool turns in the prompt and in the reply: a tool history (calls and their
results) on a template that ignores ``tools`` renders in the instruction syntax,
a template that renders tools gets it as is, and a call cut by the budget with
no text before it leaves an empty ``content`` (an empty Anthropic reply). Also,
for now, a raw text completion's leading space.

Tiny random models and the scripted engine (exact values).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

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


# --- tool history on a template that ignores tools -----------------------------


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


# --- raw text completions keep their leading space -----------------------------


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


# --- a tool call cut by the budget, with no text ---------------------------------


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

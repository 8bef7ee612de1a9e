"""Tool turns in the prompt and in the reply: a tool history (calls and their
results) on a template that ignores ``tools`` renders in the instruction syntax,
a template that renders tools gets it as is, and a call cut by the budget with
no text before it leaves an empty ``content`` (an empty Anthropic reply).

Tiny random models and the scripted engine (exact values).
"""

from __future__ import annotations

from pathlib import Path

from mlxspec.conformance.httpx_checks import checking_client
from tests.helpers import scripted_tool_server

CHAT = "/v1/chat/completions"
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

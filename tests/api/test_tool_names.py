"""Tool names follow each API's pattern, checked by the document so the 400 names
the field.

OpenAI (chat's ``tools[].function.name``, Responses' ``tools[].name``): letters,
digits, ``_`` and ``-``, at most 64 characters (its API reference; its errors
quote ``^[a-zA-Z0-9_-]+$`` and a maximum length of 64). Anthropic
(``tools[].name``): the same characters, at most 128 (its documentation says
``^[a-zA-Z0-9_-]{1,64}$``; its API has answered with ``{1,128}`` since mid-2025).
Server tools keep working: their names fit. The ``client`` fixture checks every
response against the document.
"""

from __future__ import annotations

import json

import httpx
import pytest

USER = {"role": "user", "content": "hi"}
OBJECT = {"type": "object"}
OPENAI = "^[a-zA-Z0-9_-]{1,64}$"
ANTHROPIC = "^[a-zA-Z0-9_-]{1,128}$"
#: A final newline is off the pattern too: JSON Schema's ``$`` is ECMA-262's, the
#: end of the input (Python's ``$`` also matches before a final newline).
BAD = ["get weather", "get.weather", "files/read", "météo", "a\n", "a" * 64 + "\n", "a" * 65]


def chat(name: str) -> dict:
    tool = {"type": "function", "function": {"name": name, "parameters": OBJECT}}
    return {"messages": [USER], "max_tokens": 1, "tools": [tool]}


def responses(name: str) -> dict:
    return {"input": "hi", "tools": [{"type": "function", "name": name, "parameters": OBJECT}]}


def messages(name: str) -> dict:
    return {"model": "m", "messages": [USER], "tools": [{"name": name, "input_schema": OBJECT}]}


def shown(name: str) -> str:
    """The name as the error message quotes it (JSON string escapes; long ones cut)."""
    quoted = json.dumps(name, ensure_ascii=False)
    return quoted if len(name) <= 58 else quoted[:57] + "..."


@pytest.mark.parametrize("name", BAD)
@pytest.mark.parametrize(
    ("route", "build", "param"),
    [
        ("/v1/chat/completions", chat, "tools[0].function.name"),
        ("/v1/responses", responses, "tools[0].name"),
        ("/v1/responses/input_tokens", responses, "tools[0].name"),
    ],
)
def test_openai_refuses_a_name_off_the_pattern(
    client: httpx.Client, route: str, build, param: str, name: str
) -> None:
    r = client.post(route, json=build(name))
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": {
            "message": f"Invalid value for '{param}': {shown(name)} does not match '{OPENAI}'",
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }


@pytest.mark.parametrize("name", [*BAD[:-1], "a" * 128 + "\n", "a" * 129])
@pytest.mark.parametrize("route", ["/v1/messages", "/v1/messages/count_tokens"])
def test_anthropic_refuses_a_name_off_the_pattern(
    client: httpx.Client, route: str, name: str
) -> None:
    r = client.post(route, json={**messages(name), "max_tokens": 1})
    assert r.status_code == 400, r.text
    message = f"Invalid value for 'tools[0].name': {shown(name)} does not match '{ANTHROPIC}'"
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": message},
    }


@pytest.mark.parametrize("name", ["get_weather-2", "A" * 64, "_"])
def test_openai_names_on_the_pattern_are_served(client: httpx.Client, name: str) -> None:
    r = client.post("/v1/chat/completions", json=chat(name))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 1
    r = client.post("/v1/responses/input_tokens", json=responses(name))
    assert r.status_code == 200, r.text
    assert r.json()["input_tokens"] > 0


def test_anthropic_names_up_to_128_and_server_tools_are_counted(client: httpx.Client) -> None:
    def count(tools: list[dict]) -> int:
        r = client.post("/v1/messages/count_tokens", json={**messages("x"), "tools": tools})
        assert r.status_code == 200, r.text
        return r.json()["input_tokens"]

    plain = client.post("/v1/messages/count_tokens", json={"model": "m", "messages": [USER]})
    server_tools = [
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"},
        {"type": "bash_20250124", "name": "bash"},
        {"type": "mcp_toolset", "mcp_server_name": "files"},
    ]
    # server tools are dropped: the prompt is the one without tools
    assert count(server_tools) == plain.json()["input_tokens"]
    short = count([{"name": "mcp__files__read", "input_schema": OBJECT}])
    long = count([{"name": "mcp__files__" + "r" * 116, "input_schema": OBJECT}])
    assert long > short > plain.json()["input_tokens"]

"""Every 400 the reference lists for ``/v1/chat/completions``, plus the message
rules the document adds (content on system/developer/user turns,
``tool_call_id`` on tool turns), each asserting status, message, type and param."""

from __future__ import annotations

import httpx
import pytest

CHAT = "/v1/chat/completions"
USER = {"role": "user", "content": "hi"}
INVALID = "invalid_request_error"


def assert_error(
    r: httpx.Response, message: str, param: str | None, code: str | None = None
) -> None:
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": {"message": message, "type": INVALID, "param": param, "code": code}
    }


def test_malformed_json(client: httpx.Client) -> None:
    r = client.post(CHAT, content=b'{"messages": [', headers={"content-type": "application/json"})
    assert_error(r, "invalid JSON body", None, code="invalid_json")


@pytest.mark.parametrize("body", [{"messages": []}, {}, {"messages": None}])
def test_messages_required(client: httpx.Client, body: dict) -> None:
    assert_error(client.post(CHAT, json=body), "messages required", "messages")


@pytest.mark.parametrize("role", ["wizard", 5])
def test_unknown_role(client: httpx.Client, role) -> None:
    r = client.post(CHAT, json={"messages": [USER, {"role": role, "content": "x"}]})
    message = "role must be one of 'system', 'developer', 'user', 'assistant', 'tool'"
    assert_error(r, message, "messages[1].role")


def test_missing_role_is_required_not_malformed(client: httpx.Client) -> None:
    r = client.post(CHAT, json={"messages": [USER, {"content": "x"}]})
    assert_error(r, "messages[1].role is required", "messages[1].role")


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image", "image": "data:image/png;base64,iVBORw0KGgo="},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
        {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,UklGRg=="}},
        {"type": "audio", "data": "UklGRg=="},
    ],
)
def test_media_parts_on_a_text_only_model_name_the_model(client: httpx.Client, part) -> None:
    content = [{"type": "text", "text": "look"}, part]
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": content}]})
    message = f"model tiny-llama is text-only: '{part['type']}' content parts are not supported"
    assert_error(r, message, "messages[0].content[1]")


@pytest.mark.parametrize(
    "bias,message,param",
    [
        ({"x": 1.0}, "logit_bias must be a dict of int to float", "logit_bias"),
        ({"1.5": 1.0}, "logit_bias must be a dict of int to float", "logit_bias"),
        # A bad value is found by the document, which names the key's path.
        ({"5": "high"}, "logit_bias must be a dict of int to float", "logit_bias.5"),
        ([1, 2], "logit_bias must be of type dict", "logit_bias"),
        (
            {"99999": 1.0},
            "logit_bias key 99999 is not a token id of this model (token ids are 0 to 263)",
            "logit_bias",
        ),
    ],
)
def test_invalid_logit_bias(client: httpx.Client, bias, message: str, param) -> None:
    r = client.post(CHAT, json={"messages": [USER], "logit_bias": bias})
    assert_error(r, message, param)


def test_invalid_reasoning_effort(client: httpx.Client) -> None:
    r = client.post(CHAT, json={"messages": [USER], "reasoning_effort": "max"})
    message = "reasoning_effort must be one of 'none', 'minimal', 'low', 'medium', 'high', 'xhigh'"
    assert_error(r, message, "reasoning_effort")


CONTENT_NEEDED = (
    "system, developer and user messages need content (a string or an array of content parts)"
)


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user"},
        {"role": "user", "content": None},
        {"role": "system"},
        {"role": "developer", "content": None},
    ],
)
def test_turn_without_content(client: httpx.Client, message: dict) -> None:
    r = client.post(CHAT, json={"messages": [message]})
    assert_error(r, CONTENT_NEEDED, "messages[0].content")


def test_tool_turn_without_tool_call_id(client: httpx.Client) -> None:
    messages = [USER, {"role": "tool", "content": "42"}]
    r = client.post(CHAT, json={"messages": messages})
    assert_error(
        r,
        "tool messages need tool_call_id (the id of the call they answer)",
        "messages[1].tool_call_id",
    )


def test_tool_turn_without_content(client: httpx.Client) -> None:
    messages = [USER, {"role": "tool", "tool_call_id": "call_1"}]
    r = client.post(CHAT, json={"messages": messages})
    assert_error(r, "tool messages need content (the tool's result)", "messages[1].content")


def test_assistant_turn_may_omit_content(client: httpx.Client) -> None:
    messages = [USER, {"role": "assistant"}, USER]
    assert client.post(CHAT, json={"messages": messages, "max_tokens": 1}).status_code == 200


def test_prompt_build_failure(tclient: httpx.Client) -> None:
    kwargs = {"chat_template": "{{ raise_exception('this template takes no user turns') }}"}
    r = tclient.post(CHAT, json={"messages": [USER], "chat_template_kwargs": kwargs})
    assert_error(r, "prompt build failed: this template takes no user turns", "messages")


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"add_generation_prompt": "x"}, "'add_generation_prompt'"),
        ({"tokenize": True, "tools": []}, "'tokenize', 'tools'"),
    ],
)
def test_template_kwargs_the_server_sets_are_refused(
    client: httpx.Client, kwargs: dict, names: str
) -> None:
    r = client.post(CHAT, json={"messages": [USER], "chat_template_kwargs": kwargs})
    message = (
        f"chat_template_kwargs cannot set {names}: the server sets it when it renders the prompt"
    )
    assert_error(r, message, "chat_template_kwargs")


def test_prompt_over_the_context_window(client: httpx.Client, tiny_engine) -> None:
    messages = [{"role": "user", "content": "hello " * 400}]
    prompt = len(tiny_engine.chat_prompt(messages, None, None))
    r = client.post(CHAT, json={"messages": messages})
    message = (
        f"This model's maximum context length is {tiny_engine.info.context_window} tokens, "
        f"but the prompt has {prompt} tokens, leaving no room to generate."
    )
    assert_error(r, message, "messages", code="context_length_exceeded")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        (
            "functions",
            [{"name": "f", "parameters": {}}],
            "functions is not supported; send tools instead",
        ),
        ("function_call", "auto", "function_call is not supported; send tool_choice instead"),
    ],
)
def test_deprecated_function_fields_are_refused(
    client: httpx.Client, field: str, value: object, message: str
) -> None:
    """OpenAI's deprecated ``functions``/``function_call`` are never silently ignored."""
    r = client.post(CHAT, json={"messages": [USER], field: value})
    assert_error(r, message, field)

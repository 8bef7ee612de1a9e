"""HTTP tests on the tiny random model: shapes, errors, streaming, disconnects.

The app validates every JSON response against the OpenAPI document
(``validate_responses=True``), so a non-conforming body shows up as a 500.
"""

from __future__ import annotations

import json
import time

import httpx
import pytest

from mlxspec.http.app import NO_TYPE

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
NO_EOS = {"2": -1e9}  # the tiny model's EOS id; forbidding it forces long outputs


def user(text: str = "hi") -> list[dict]:
    return [{"role": "user", "content": text}]


def assert_error(
    r: httpx.Response, status: int, param: str | None = None, message: str | None = None
) -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param
    if message is not None:
        assert err["message"] == message
    return err


def sse_events(r: httpx.Response) -> list[str]:
    return [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]


# --- discovery routes -------------------------------------------------------


def test_health_is_exact(client: httpx.Client) -> None:
    r = client.get("/health")
    assert r.status_code == 200
    assert r.content == b'{"status": "ok"}'


def test_models_list_and_retrieve(client: httpx.Client) -> None:
    data = client.get("/v1/models").json()
    assert data["object"] == "list"
    row = data["data"][0]
    assert (row["id"], row["object"], row["owned_by"], row["context_window"]) == (
        "tiny-llama",
        "model",
        "mlxspec",
        256,
    )
    one = client.get("/v1/models/tiny-llama").json()
    assert one == row
    assert_error(client.get("/v1/models/other"), 404, param="model_id")


def test_api_index_and_document(client: httpx.Client) -> None:
    index = client.get("/v1").json()
    assert index["name"] == "mlxspec" and index["model"] == "tiny-llama"
    assert "POST /v1/chat/completions" in index["endpoints"]
    doc = client.get("/openapi.json").json()
    operations = {
        f"{method.upper()} {path}" for path, item in doc["paths"].items() for method in item
    }
    assert set(index["endpoints"]) == operations | {"GET /openapi.json"}
    assert "DELETE /v1/responses/{response_id}" in index["endpoints"]
    assert doc["openapi"].startswith("3.1")
    assert "/v1/chat/completions" in doc["paths"]


def test_unknown_path_and_wrong_method(client: httpx.Client) -> None:
    assert_error(client.get("/v2/nothing"), 404, message="not found")
    r = client.get(CHAT)
    assert_error(r, 405)
    assert "POST" in r.headers.get("allow", "")


# --- chat -------------------------------------------------------------------


def test_chat_completion_shape(client: httpx.Client) -> None:
    r = client.post(CHAT, json={"messages": user(), "max_tokens": 4, "model": "ignored"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert body["model"] == "tiny-llama"
    choice = body["choices"][0]
    assert choice["message"]["role"] == "assistant"
    assert isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] in {"stop", "length"}
    u = body["usage"]
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
    assert 1 <= u["completion_tokens"] <= 4


def test_max_completion_tokens_wins(client: httpx.Client) -> None:
    body = {"messages": user(), "max_tokens": 9, "max_completion_tokens": 3, "logit_bias": NO_EOS}
    u = client.post(CHAT, json=body).json()["usage"]
    assert u["completion_tokens"] == 3


def test_stream_matches_non_stream(client: httpx.Client) -> None:
    body = {"messages": user("hello"), "max_tokens": 12, "logit_bias": NO_EOS}
    whole = client.post(CHAT, json=body).json()
    r = client.post(CHAT, json={**body, "stream": True, "stream_options": {"include_usage": True}})
    assert r.headers["content-type"].startswith("text/event-stream")
    assert r.headers["cache-control"] == "no-cache"
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    *chunks, usage = chunks
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in [*chunks, usage]}) == 1
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == whole["choices"][0]["message"]["content"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"] == 12


def test_stop_string_spanning_tokens_never_appears(client: httpx.Client, tiny_engine) -> None:
    base = {"messages": user("hello"), "max_tokens": 16, "logit_bias": NO_EOS, "logprobs": True}
    whole = client.post(CHAT, json=base).json()["choices"][0]
    full = whole["message"]["content"]
    ids = [e["id"] for e in whole["logprobs"]["content"]]
    pieces = [tiny_engine.tokenizer.decode([i]) for i in ids]
    assert "".join(pieces) == full
    # A stop made of the last character of token 2 and the first of token 3.
    cut = len(pieces[0]) + len(pieces[1]) + len(pieces[2])
    stop = full[cut - 1 : cut + 1]
    assert len(stop) == 2
    body = {**base, "stop": [stop, "\u0000never"]}
    out = client.post(CHAT, json=body).json()["choices"][0]
    assert out["message"]["content"] == full[: full.find(stop)]
    assert out["finish_reason"] == "stop"
    events = sse_events(client.post(CHAT, json={**body, "stream": True}))
    deltas = [json.loads(e)["choices"][0]["delta"].get("content") or "" for e in events[:-1]]
    assert "".join(deltas) == out["message"]["content"]
    assert stop not in "".join(deltas)


@pytest.mark.parametrize(
    "messages",
    [
        [
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            }
        ],
        [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "u"},
            {"role": "system", "content": "late"},
            {"role": "user", "content": "again"},
        ],
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": '{"x": 1}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "1"},
        ],
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": {"x": 1}},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "1"},
        ],
    ],
)
def test_robust_message_shapes(client: httpx.Client, messages: list) -> None:
    r = client.post(CHAT, json={"messages": messages, "max_tokens": 2})
    assert r.status_code == 200, r.text


# --- completions --------------------------------------------------------------


def test_text_completion_and_stream(client: httpx.Client) -> None:
    body = {"prompt": "hello", "max_tokens": 6, "logit_bias": NO_EOS}
    whole = client.post(COMP, json=body).json()
    assert whole["object"] == "text_completion" and whole["id"].startswith("cmpl-")
    assert whole["choices"][0]["finish_reason"] == "length"
    asked = {"stream": True, "stream_options": {"include_usage": True}}
    events = sse_events(client.post(COMP, json={**body, **asked}))
    assert events[-1] == "[DONE]"
    *chunks, usage = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    # the second request may reuse the first one's prompt KV (prompt cache)
    streamed_usage = {**usage["usage"], "prompt_tokens_details": None}
    assert streamed_usage == {**whole["usage"], "prompt_tokens_details": None}


def test_logprobs_block(client: httpx.Client) -> None:
    r = client.post(COMP, json={"prompt": "hello", "max_tokens": 3, "top_logprobs": 2})
    content = r.json()["choices"][0]["logprobs"]["content"]
    assert len(content) == r.json()["usage"]["completion_tokens"]
    first = content[0]
    assert first["top_logprobs"][0] == {k: first[k] for k in ("id", "token", "logprob")}
    r = client.post(COMP, json={"prompt": "hello", "max_tokens": 2, "logprobs": True})
    assert set(r.json()["choices"][0]["logprobs"]["content"][0]) == {"id", "logprob"}


# --- errors -------------------------------------------------------------------


def test_malformed_and_non_object_bodies(client: httpx.Client) -> None:
    h = {"content-type": "application/json"}
    assert_error(client.post(CHAT, content=b"{nope", headers=h), 400, message="invalid JSON body")
    assert_error(
        client.post(CHAT, content=b'{"messages": NaN}', headers=h), 400, message="invalid JSON body"
    )
    assert_error(client.post(CHAT, content=b"[1, 2]", headers=h), 400)
    assert_error(client.post(CHAT, content=b'"text"', headers=h), 400)
    assert_error(client.post(CHAT, content=b"", headers=h), 400)


def test_content_type(client: httpx.Client) -> None:
    body = json.dumps({"messages": user(), "max_tokens": 1}).encode()
    assert_error(client.post(CHAT, content=body, headers={"content-type": "text/plain"}), 415)
    # No Content-Type at all: a 415 too (a web page can send such a body cross-origin
    # without a preflight; it used to be read as JSON).
    assert_error(client.post(CHAT, content=body), 415, message=NO_TYPE)


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_tokens", 0),
        ("max_tokens", -3),
        ("max_tokens", 2.0),
        ("max_tokens", "8"),
        ("temperature", -1),
        ("top_p", 1.5),
        ("top_k", -1),
        ("min_p", 2),
        ("top_logprobs", 12),
        ("logprobs", 1),
        ("stream", "yes"),
        ("seed", 1.5),
    ],
)
def test_sampling_field_errors_name_the_field(client: httpx.Client, field: str, value) -> None:
    r = client.post(CHAT, json={"messages": user(), field: value})
    assert_error(r, 400, param=field)


def test_message_errors(client: httpx.Client) -> None:
    assert_error(client.post(CHAT, json={"messages": []}), 400, param="messages")
    assert_error(client.post(CHAT, json={}), 400, param="messages")
    r = client.post(CHAT, json={"messages": [{"role": "wizard", "content": "x"}]})
    assert_error(r, 400, param="messages[0].role")
    r = client.post(
        CHAT,
        json={
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
            ]
        },
    )
    err = assert_error(r, 400, param="messages[0].content[0]")
    assert "tiny-llama" in err["message"]


def test_prompt_errors(client: httpx.Client) -> None:
    assert_error(client.post(COMP, json={"prompt": ""}), 400, param="prompt")
    assert_error(client.post(COMP, json={"prompt": ["a", "b"]}), 400, param="prompt")
    assert_error(client.post(COMP, json={}), 400, param="prompt")


def test_prompt_over_context_window(client: httpx.Client) -> None:
    r = client.post(COMP, json={"prompt": "hello " * 400, "max_tokens": 1})
    err = assert_error(r, 400, param="prompt")
    assert err["code"] == "context_length_exceeded" and "256" in err["message"]
    r = client.post(CHAT, json={"messages": user("hello " * 400)})
    assert assert_error(r, 400, param="messages")["code"] == "context_length_exceeded"


def test_logit_bias_keys(client: httpx.Client) -> None:
    r = client.post(COMP, json={"prompt": "a", "logit_bias": {"x": 1.0}})
    assert_error(r, 400, param="logit_bias", message="logit_bias must be a dict of int to float")


# --- disconnects ----------------------------------------------------------------


def test_disconnect_mid_stream_cancels_and_server_keeps_serving(
    tiny_server, tiny_engine, client: httpx.Client
) -> None:
    before = tiny_engine.counters["cancelled"]
    body = {"messages": user("hello"), "stream": True, "logit_bias": NO_EOS}
    with (
        httpx.Client(base_url=tiny_server.base, timeout=30) as c,
        c.stream("POST", CHAT, json=body) as r,
    ):
        lines = r.iter_lines()
        got = [next(lines) for _ in range(6)]
        assert any(line.startswith("data: ") for line in got)
    deadline = time.monotonic() + 10
    while tiny_engine.counters["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tiny_engine.counters["cancelled"] == before + 1
    r = client.post(CHAT, json={"messages": user(), "max_tokens": 2})
    assert r.status_code == 200


def test_disconnect_during_non_stream_request_cancels(tiny_server, tiny_engine, client) -> None:
    before = tiny_engine.counters["cancelled"]
    body = {"messages": user("hello"), "logit_bias": NO_EOS}  # runs to the context window
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{tiny_server.base}{CHAT}", json=body, timeout=0.15)
    deadline = time.monotonic() + 10
    while tiny_engine.counters["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tiny_engine.counters["cancelled"] == before + 1
    assert client.post(CHAT, json={"messages": user(), "max_tokens": 2}).status_code == 200


def test_null_optional_fields_mean_absent(client: httpx.Client) -> None:
    nulls = {
        k: None
        for k in (
            "model",
            "tools",
            "tool_choice",
            "response_format",
            "parallel_tool_calls",
            "chat_template_kwargs",
            "reasoning_effort",
            "temperature",
            "top_p",
            "top_k",
            "stop",
            "seed",
            "logit_bias",
            "logprobs",
            "top_logprobs",
            "n",
            "user",
            "stream",
            "session_id",
            "prompt_cache_key",
            "max_tokens",
        )
    }
    body = {
        "messages": user(),
        **nulls,
        "max_completion_tokens": 2,
        "stream_options": {"include_usage": None},
    }
    r = client.post(CHAT, json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 2


def test_reasoning_effort_values(client: httpx.Client) -> None:
    ok = client.post(CHAT, json={"messages": user(), "max_tokens": 1, "reasoning_effort": "low"})
    assert ok.status_code == 200
    r = client.post(CHAT, json={"messages": user(), "reasoning_effort": "bogus"})
    assert_error(
        r,
        400,
        param="reasoning_effort",
        message=(
            "reasoning_effort must be one of 'none', 'minimal', 'low', 'medium', 'high', 'xhigh'"
        ),
    )


def test_a_prompt_too_long_to_fit_is_refused_before_it_is_tokenized(
    client: httpx.Client,
) -> None:
    """More characters than the window's tokens can spell: a 400 that counts
    characters (the text never reached the tokenizer), for both prompt kinds."""
    text = "hello " * 200_000  # 1.2M characters; the tiny model's window is 256 tokens
    r = client.post(COMP, json={"prompt": text, "max_tokens": 1})
    err = assert_error(r, 400, param="prompt")
    assert err["code"] == "context_length_exceeded"
    assert f"the prompt is {len(text)} characters long" in err["message"]
    assert err["message"].startswith("This model's maximum context length is 256 tokens")
    r = client.post(CHAT, json={"messages": user(text)})
    err = assert_error(r, 400, param="messages")
    assert err["code"] == "context_length_exceeded" and "characters long" in err["message"]

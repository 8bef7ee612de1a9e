"""``/v1/responses`` on a live server with the tiny random model: the official
``openai`` SDK (stream and not, a conversation through ``previous_response_id``,
stored-response retrieval and deletion) and raw contract-checked requests.

The SDK's HTTP client checks every response (and each stream frame) against
the OpenAPI document. Greedy decoding, a fixed ``max_output_tokens`` and the
EOS token forbidden make outputs deterministic.
"""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from mlxspec.conformance.contract import split_named_event_stream
from mlxspec.engine import Constraint
from mlxspec.handlers.turns.structured import instruction

NO_EOS = {"2": -1e9}  # the tiny model's EOS id
ONLY_EOS = {"2": 1e9}
FIXED = {"model": "any", "max_output_tokens": 8, "temperature": 0}


def create(sdk: openai.OpenAI, bias: dict = NO_EOS, **fields):
    return sdk.responses.create(**FIXED, extra_body={"logit_bias": bias}, **fields)


def prompt_tokens(engine, messages: list[dict]) -> int:
    return len(engine.chat_prompt(messages))


def test_create_answers_an_incomplete_response_at_max_output_tokens(sdk, tiny_engine) -> None:
    r = create(sdk, input="hello", instructions="Be brief.")
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny-llama"
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.instructions == "Be brief." and r.previous_response_id is None
    assert r.max_output_tokens == 8 and r.temperature == 0.0
    [message] = r.output
    assert message.type == "message" and message.role == "assistant"
    assert message.status == "incomplete" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    assert r.output_text == message.content[0].text != ""
    expected = prompt_tokens(
        tiny_engine,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"}],
    )
    assert r.usage.input_tokens == expected
    assert r.usage.output_tokens == 8
    assert r.usage.total_tokens == expected + 8
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    assert r.usage.input_tokens_details.cached_tokens >= 0


def test_eos_first_completes_with_one_empty_message(sdk) -> None:
    r = create(sdk, bias=ONLY_EOS, input="hello")
    assert r.status == "completed" and r.incomplete_details is None
    assert [item.type for item in r.output] == ["message"]
    assert r.output[0].status == "completed" and r.output_text == ""
    assert r.usage.output_tokens == 1  # the EOS token, counted as mlx-lm does


def test_stream_events_follow_openai_and_deltas_join_to_the_text(sdk) -> None:
    whole = create(sdk, input="hello")
    events = list(create(sdk, input="hello", stream=True))
    kinds = [e.type for e in events]
    deltas = kinds.count("response.output_text.delta")
    assert deltas >= 1
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        *["response.output_text.delta"] * deltas,
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text
    assert events[-3].part.text == events[-4].text == text
    final = events[-1].response
    assert {e.response.id for e in events if hasattr(e, "response")} == {final.id}
    assert final.output_text == text and final.status == "incomplete"
    assert final.usage.output_tokens == 8
    assert events[2].item.id == events[-2].item.id == final.output[0].id


def test_the_sdk_stream_helper_assembles_the_final_response(sdk) -> None:
    with sdk.responses.stream(
        **FIXED, input="hello", extra_body={"logit_bias": ONLY_EOS}
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" not in kinds  # EOS first: an empty message
    assert final.status == "completed" and final.output_text == ""
    assert final.output[0].type == "message" and final.output[0].status == "completed"


def test_stream_frames_are_named_events(client: httpx.Client) -> None:
    body = {"input": "hi", "stream": True, "max_output_tokens": 3, "logit_bias": NO_EOS}
    with client.stream("POST", "/v1/responses", json=body) as r:
        raw = r.read()
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = split_named_event_stream(raw)
    assert events[0][0] == "response.created" and events[-1][0] == "response.incomplete"
    assert b"[DONE]" not in raw


def test_two_turns_through_previous_response_id(sdk, tiny_engine) -> None:
    first = create(sdk, input="hello", instructions="Be brief.")
    second = create(sdk, input="and again", previous_response_id=first.id)
    assert second.previous_response_id == first.id
    assert second.instructions == "Be brief."  # carried forward
    history = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "and again"},
    ]
    assert second.usage.input_tokens == prompt_tokens(tiny_engine, history)
    third = create(sdk, input="once more", previous_response_id=second.id, instructions="Ramble.")
    history = [
        {"role": "system", "content": "Ramble."},
        *history[1:],
        {"role": "assistant", "content": second.output_text},
        {"role": "user", "content": "once more"},
    ]
    assert third.usage.input_tokens == prompt_tokens(tiny_engine, history)


def test_a_streamed_response_can_be_continued(sdk, tiny_engine) -> None:
    events = list(create(sdk, input="hello", stream=True))
    first = events[-1].response
    second = create(sdk, input="next", previous_response_id=first.id)
    history = [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "next"},
    ]
    assert second.usage.input_tokens == prompt_tokens(tiny_engine, history)


def test_unknown_previous_response_id_is_a_404(sdk) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        create(sdk, input="hi", previous_response_id="resp_nope")
    assert err.value.status_code == 404
    assert err.value.body == {
        "message": "response 'resp_nope' not found or expired",
        "type": "invalid_request_error",
        "param": "previous_response_id",
        "code": "response_not_found",
    }


def test_an_output_for_an_unknown_call_is_a_400(sdk) -> None:
    """A ``function_call_output`` answers a call made earlier (in the input or
    the stored conversation), as OpenAI requires."""
    items = [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_2", "output": "18C"},
    ]
    with pytest.raises(openai.BadRequestError) as err:
        create(sdk, input=items)
    assert err.value.body == {
        "message": "No tool call found for function call output with call_id call_2.",
        "type": "invalid_request_error",
        "param": "input",
        "code": None,
    }
    # An output placed before its call is no answer either.
    with pytest.raises(openai.BadRequestError):
        create(sdk, input=[items[0], items[2], {**items[1], "call_id": "call_2"}])


def test_retrieve_and_delete_a_stored_response(sdk) -> None:
    r = create(sdk, input="hello")
    got = sdk.responses.retrieve(r.id)
    assert got.model_dump() == r.model_dump()
    sdk.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        create(sdk, input="again", previous_response_id=r.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.delete(r.id)


def test_store_false_keeps_nothing(sdk) -> None:
    r = create(sdk, input="hello", store=False, prompt_cache_key="agent-7")
    assert r.store is False and r.prompt_cache_key == "agent-7"
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(r.id)


def test_stats_report_the_store(client: httpx.Client) -> None:
    before = client.get("/stats").json()["response_store"]
    r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 1})
    after = client.get("/stats").json()["response_store"]
    assert after["entries"] == before["entries"] + 1 and after["bytes"] > before["bytes"]
    assert after["max_bytes"] == 32 * 1024 * 1024 and after["ttl_ms"] == 3_600_000
    assert client.delete(f"/v1/responses/{r.json()['id']}").status_code == 200
    assert client.get("/stats").json()["response_store"] == before


def test_function_tools_and_tool_choice_are_accepted(sdk) -> None:
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "description": "Weather.",
            "parameters": {"type": "object"},  # the tiny model's window is 256 tokens
            "strict": False,
        },
        {"type": "web_search"},
    ]
    r = create(sdk, input="weather?", tools=tools, tool_choice="auto")
    assert [t.name for t in r.tools] == ["get_weather"]
    assert r.tool_choice == "auto" and r.output[0].type == "message"


def test_function_call_output_items_continue_a_conversation(sdk, tiny_engine) -> None:
    items = [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
    ]
    r = create(sdk, input=items)
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
    ]
    assert r.usage.input_tokens == prompt_tokens(tiny_engine, messages)


BAD_REQUESTS = [
    # id, body, message, param
    ("no input", {}, "input is required unless previous_response_id is given", "input"),
    ("input number", {"input": 5}, None, "input"),
    (
        "item role",
        {"input": [{"role": "wizard", "content": "x"}]},
        None,
        "input[0].role",
    ),
    (
        "call without call_id",
        {"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
        "input[0].call_id is required",
        "input[0].call_id",
    ),
    ("item type", {"input": [{"type": "item_reference", "id": "x"}]}, None, "input[0].type"),
    ("max_output_tokens", {"input": "x", "max_output_tokens": 0}, None, "max_output_tokens"),
    (
        "function tool without name",
        {"input": "x", "tools": [{"type": "function"}]},
        None,
        "tools[0].name",
    ),
    ("tool_choice", {"input": "x", "tool_choice": "sometimes"}, None, "tool_choice"),
]


@pytest.mark.parametrize(
    ("body", "message", "param"), [c[1:] for c in BAD_REQUESTS], ids=[c[0] for c in BAD_REQUESTS]
)
def test_bad_requests_are_400s_in_openai_shape(client: httpx.Client, body, message, param) -> None:
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    if message is not None:
        assert error["message"] == message


def test_image_input_on_a_text_only_model_is_a_400(client: httpx.Client) -> None:
    part = {"type": "input_image", "image_url": "data:image/png;base64,AA=="}
    r = client.post("/v1/responses", json={"input": [{"role": "user", "content": [part]}]})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "model tiny-llama is text-only: 'image_url' content parts are not supported",
        "type": "invalid_request_error",
        "param": "input",
        "code": None,
    }


def test_contract_non_stream_get_delete_and_404s(client: httpx.Client) -> None:
    r = client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 2})
    assert r.status_code == 200
    rid = r.json()["id"]
    assert client.get(f"/v1/responses/{rid}").json() == r.json()
    assert client.delete(f"/v1/responses/{rid}").json() == {
        "id": rid,
        "object": "response",
        "deleted": True,
    }
    missing = client.get(f"/v1/responses/{rid}")
    assert missing.status_code == 404
    assert missing.json()["error"] == {
        "message": f"response '{rid}' not found or expired",
        "type": "invalid_request_error",
        "param": "response_id",
        "code": "response_not_found",
    }
    assert client.delete(f"/v1/responses/{rid}").status_code == 404


ANSWER = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
JSON_FORMAT = {"type": "json_schema", "name": "answer", "schema": ANSWER, "any_whitespace": False}


def test_text_format_json_schema_is_enforced(sdk) -> None:
    r = sdk.responses.create(
        model="m", input="hello", temperature=0, max_output_tokens=20, text={"format": JSON_FORMAT}
    )
    assert r.status == "completed"
    assert json.loads(r.output_text) in ({"ok": True}, {"ok": False})
    assert r.text.format.type == "json_schema" and r.text.format.name == "answer"


def test_text_format_stream_is_enforced_and_a_bad_schema_degrades(
    client: httpx.Client, tiny_engine
) -> None:
    body = {"input": "hi", "max_output_tokens": 20, "text": {"format": JSON_FORMAT}, "stream": True}
    r = client.post("/v1/responses", json=body)
    assert r.status_code == 200 and "warning" not in r.headers
    events = [json.loads(data) for _, data in split_named_event_stream(r.content)]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert json.loads(text) in ({"ok": True}, {"ok": False})
    bad = {"type": "json_schema", "name": "x", "schema": {"type": "string", "pattern": "("}}
    r = client.post(
        "/v1/responses", json={"input": "hi", "max_output_tokens": 2, "text": {"format": bad}}
    )
    assert r.status_code == 200
    assert r.headers["warning"].startswith("grammar not enforced: ")
    # degraded: the schema is described to the model in the system message instead
    note = instruction(Constraint("json_schema", json.dumps(bad["schema"])))
    messages = [{"role": "system", "content": note}, {"role": "user", "content": "hi"}]
    assert r.json()["usage"]["input_tokens"] == prompt_tokens(tiny_engine, messages)


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions"])
def test_an_empty_conversation_is_a_clear_400(client: httpx.Client, path: str) -> None:
    # the template's own words ("Cannot apply chat template to an empty conversation")
    # used to reach the client after "prompt build failed:"
    body = {"input": []} if path == "/v1/responses" else {"messages": []}
    r = client.post(path, json={**body, "max_tokens": 2} if "chat" in path else body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    if path == "/v1/responses":
        assert (error["message"], error["param"]) == (
            "the conversation is empty: send at least one message",
            "input",
        )
    else:  # the document refuses an empty messages array before any template runs
        assert error["param"] == "messages"

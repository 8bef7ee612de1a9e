"""Responses surface, pure parts: request -> chat body, and chat events -> output items
and stream events (scripted turns: reasoning, text, tool calls, failures)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mlxspec.engine import Finished
from mlxspec.errors import ApiError
from mlxspec.handlers.responses.input import to_chat_body
from mlxspec.handlers.responses.output import ResponseBuilder, turn_as_events
from mlxspec.handlers.responses.store import Conversation
from mlxspec.handlers.turns.parser import (
    ChatTurn,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    TurnEnd,
)

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
}


def call(i: int, city: str) -> dict:
    """A chat tool call of get_weather, as the translation writes it."""
    arguments = json.dumps({"city": city})
    return {
        "id": f"call_{i}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }


def test_string_input_is_one_user_message() -> None:
    chat, conversation = to_chat_body({"input": "hi", "max_output_tokens": 5})
    assert chat == {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    assert conversation == Conversation(None, (), ({"role": "user", "content": "hi"},))


def test_items_tools_and_fields_translate_to_the_chat_body() -> None:
    body = {
        "model": "ignored",
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Use metric units."},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "Paris?"}],
            },
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
            },
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": '{"city": "Paris"}',
            },
            {
                "type": "function_call",
                "call_id": "call_2",
                "name": "get_weather",
                "arguments": '{"city": "Lyon"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
            {
                "type": "function_call_output",
                "call_id": "call_2",
                "output": [
                    {"type": "input_text", "text": "20"},
                    {"type": "input_text", "text": "C"},
                ],
            },
            {"role": "system", "content": [{"type": "input_text", "text": "Answer in English."}]},
        ],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "Weather.",
                "parameters": WEATHER,
            },
            {"type": "web_search"},
            {"type": "file_search", "vector_store_ids": ["vs_1"]},
        ],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": 7,
        "max_tokens": 99,
        "temperature": 0.5,
        "top_k": 3,
        "min_p": 0.1,
        "logit_bias": {"2": -5},
        "repetition_penalty": 1.1,
        "parallel_tool_calls": False,
        "prompt_cache_key": "agent-7",
        "session_id": "s-1",
        "stream": True,
        "store": False,
        "metadata": {"k": "v"},
    }
    chat, _ = to_chat_body(body)
    assert chat == {
        "messages": [
            {"role": "system", "content": "Be brief.\n\nUse metric units.\n\nAnswer in English."},
            {"role": "user", "content": [{"type": "text", "text": "Paris?"}]},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Checking."}],
                "tool_calls": [call(1, "Paris"), call(2, "Lyon")],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18C"},
            {"role": "tool", "tool_call_id": "call_2", "content": "20C"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Weather.",
                    "parameters": WEATHER,
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 7,
        "temperature": 0.5,
        "top_k": 3,
        "min_p": 0.1,
        "logit_bias": {"2": -5},
        "repetition_penalty": 1.1,
        "parallel_tool_calls": False,
        "prompt_cache_key": "agent-7",
        "session_id": "s-1",
    }


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_string_tool_choices_pass_through(choice: str) -> None:
    assert to_chat_body({"input": "x", "tool_choice": choice})[0]["tool_choice"] == choice


def test_max_tokens_is_accepted_when_max_output_tokens_is_absent() -> None:
    assert to_chat_body({"input": "x", "max_tokens": 4})[0]["max_tokens"] == 4
    assert (
        to_chat_body({"input": "x", "max_completion_tokens": 6, "max_tokens": 4})[0]["max_tokens"]
        == 6
    )


def test_image_parts_reach_the_models_media_check() -> None:
    part = {"type": "input_image", "image_url": "data:image/png;base64,AA=="}
    chat, _ = to_chat_body({"input": [{"role": "user", "content": [part]}]})
    assert chat["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}
    ]


def test_previous_conversation_is_spliced_in_and_instructions_carry_forward() -> None:
    previous = Conversation(
        "Be brief.",
        ("Use metric units.",),
        ({"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}),
    )
    chat, conversation = to_chat_body({"input": "again"}, previous)
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief.\n\nUse metric units."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "again"},
    ]
    assert conversation.instructions == "Be brief."
    chat, conversation = to_chat_body({"input": "again", "instructions": "Be long."}, previous)
    assert chat["messages"][0] == {"role": "system", "content": "Be long.\n\nUse metric units."}
    assert to_chat_body({"previous_response_id": "resp_1"}, previous)[0]["messages"][-1] == {
        "role": "assistant",
        "content": "hello",
    }


FINISHED = Finished("stop", prompt_tokens=20, completion_tokens=9, cached_tokens=4)
SKELETON = {"id": "resp_1", "object": "response", "created_at": 1, "model": "m"}


def fold(events: list, count=lambda text: len(text.split())) -> tuple[ResponseBuilder, list]:
    builder = ResponseBuilder(dict(SKELETON), count)
    frames = builder.start()
    for event in events:
        frames += builder.feed(event)
    return builder, frames


def test_reasoning_text_and_tool_calls_become_items_and_events() -> None:
    events = [
        ReasoningDelta("think "),
        ReasoningDelta("hard"),
        TextDelta("Let me "),
        TextDelta("check."),
        ToolCallStart(0, "call_a", "get_weather"),
        ToolCallArguments(0, '{"city": '),
        ToolCallArguments(0, '"Paris"}'),
        ToolCallStart(1, "call_b", "get_time"),
        ToolCallArguments(1, "{}"),
        TurnEnd("tool_calls", FINISHED),
    ]
    builder, frames = fold(events)
    names = [name for name, _ in frames]
    assert names == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [p["sequence_number"] for _, p in frames] == list(range(len(frames)))
    assert all(p["type"] == name for name, p in frames)
    final = frames[-1][1]["response"]
    rs, msg, fc_a, fc_b = final["output"]
    assert rs == {
        "id": rs["id"],
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "think hard"}],
    }
    assert msg == {
        "id": msg["id"],
        "type": "message",
        "status": "completed",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Let me check.", "annotations": []}],
    }
    assert fc_a == {
        "id": fc_a["id"],
        "type": "function_call",
        "status": "completed",
        "call_id": "call_a",
        "name": "get_weather",
        "arguments": '{"city": "Paris"}',
    }
    assert (fc_b["call_id"], fc_b["name"], fc_b["arguments"]) == ("call_b", "get_time", "{}")
    assert [rs["id"][:3], msg["id"][:4], fc_a["id"][:3]] == ["rs_", "msg_", "fc_"]
    assert final["status"] == "completed" and final["incomplete_details"] is None
    assert final["usage"] == {
        "input_tokens": 20,
        "input_tokens_details": {"cached_tokens": 4},
        "output_tokens": 9,
        "output_tokens_details": {"reasoning_tokens": 2},
        "total_tokens": 29,
    }
    deltas = [p["delta"] for n, p in frames if n == "response.function_call_arguments.delta"]
    assert deltas == ['{"city": ', '"Paris"}', "{}"]
    done = [p for n, p in frames if n == "response.function_call_arguments.done"]
    assert [(p["item_id"], p["output_index"], p["arguments"]) for p in done] == [
        (fc_a["id"], 2, '{"city": "Paris"}'),
        (fc_b["id"], 3, "{}"),
    ]
    assert builder.tool_calls == [
        {"id": "call_a", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"id": "call_b", "name": "get_time", "arguments": "{}"},
    ]
    # the opening events show an empty, in-progress response
    assert frames[0][1]["response"]["status"] == "in_progress"
    assert frames[0][1]["response"]["output"] == [] and frames[0][1]["response"]["usage"] is None


def test_a_non_streamed_turn_folds_to_the_same_output() -> None:
    turn = ChatTurn(
        content="Let me check.",
        reasoning="think hard",
        tool_calls=[ToolCall("call_a", "get_weather", '{"city": "Paris"}')],
        finish_reason="tool_calls",
        finished=FINISHED,
    )
    streamed, _ = fold(
        [
            ReasoningDelta("think "),
            ReasoningDelta("hard"),
            TextDelta("Let me check."),
            ToolCallStart(0, "call_a", "get_weather"),
            ToolCallArguments(0, '{"city": "Paris"}'),
            TurnEnd("tool_calls", FINISHED),
        ]
    )
    collected, _ = fold(turn_as_events(turn))

    def strip(output: list) -> list:
        return [{k: v for k, v in item.items() if k != "id"} for item in output]

    assert strip(collected.output) == strip(streamed.output)
    assert collected.response["usage"] == streamed.response["usage"]


def test_only_tool_calls_gives_no_message_item() -> None:
    builder, _ = fold(
        [
            ToolCallStart(0, "call_a", "f"),
            ToolCallArguments(0, "{}"),
            TurnEnd("tool_calls", FINISHED),
        ]
    )
    assert [item["type"] for item in builder.output] == ["function_call"]
    assert builder.output_text() is None


def test_an_empty_reply_is_one_empty_message() -> None:
    builder, frames = fold([TextDelta(""), TurnEnd("stop", FINISHED)])
    assert [n for n, _ in frames][2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert builder.output[0]["content"] == [{"type": "output_text", "text": "", "annotations": []}]
    assert builder.output_text() == ""


def test_length_makes_the_response_incomplete() -> None:
    builder, frames = fold([TextDelta("Once"), TurnEnd("length", Finished("length", 3, 1))])
    name, payload = frames[-1]
    assert name == "response.incomplete"
    response = payload["response"]
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"
    assert response["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}


def test_a_whole_call_before_the_cut_is_completed_in_an_incomplete_response() -> None:
    # the budget ran out after the call's arguments (say on its closing markup)
    builder, frames = fold(
        [
            ToolCallStart(0, "call_a", "f"),
            ToolCallArguments(0, "{}"),
            TurnEnd("length", Finished("length", 3, 5)),
        ]
    )
    name, payload = frames[-1]
    assert (name, payload["response"]["status"]) == ("response.incomplete", "incomplete")
    (call,) = payload["response"]["output"]
    assert (call["type"], call["status"], call["arguments"]) == ("function_call", "completed", "{}")
    done = [p for n, p in frames if n == "response.function_call_arguments.done"]
    assert [d["arguments"] for d in done] == ["{}"]
    assert builder.tool_calls == [{"id": "call_a", "name": "f", "arguments": "{}"}]


def test_a_failure_ends_with_error_then_response_failed() -> None:
    builder, frames = fold([TextDelta("Once")])
    frames += builder.fail(ApiError("server_error", "generation failed"))
    (err_name, err), (failed_name, failed) = frames[-2:]
    assert err_name == "error" and failed_name == "response.failed"
    n = len(frames)
    assert err == {
        "type": "error",
        "code": "server_error",
        "message": "generation failed",
        "param": None,
        "sequence_number": n - 2,
    }
    assert failed["sequence_number"] == n - 1
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "generation failed"}


def test_stream_events_do_not_alias_the_response() -> None:
    builder, frames = fold([TextDelta("a"), TurnEnd("stop", FINISHED)])
    added = next(p for n, p in frames if n == "response.output_item.added")
    assert added["item"]["status"] == "in_progress" and added["item"]["content"] == []
    assert builder.output[0]["status"] == "completed"


PIECES = st.lists(st.text(min_size=1, max_size=4), max_size=4)


@given(
    reasoning=PIECES,
    text=PIECES,
    calls=st.lists(st.tuples(st.sampled_from(["f", "g"]), PIECES), max_size=3),
    finish=st.sampled_from(["stop", "length", "tool_calls"]),
)
def test_any_chunking_streams_what_the_collected_turn_answers(
    reasoning: list[str], text: list[str], calls: list, finish: str
) -> None:
    finished = Finished("length" if finish == "length" else "stop", 5, 7)
    events: list = [ReasoningDelta(r) for r in reasoning] + [TextDelta(t) for t in text]
    for i, (name, pieces) in enumerate(calls):
        events.append(ToolCallStart(i, f"call_{i}", name))
        events += [ToolCallArguments(i, p) for p in pieces]
    streamed, frames = fold([*events, TurnEnd(finish, finished)])
    turn = ChatTurn(
        content="".join(text) or (None if calls else ""),
        reasoning="".join(reasoning) or None,
        tool_calls=[ToolCall(f"call_{i}", n, "".join(p)) for i, (n, p) in enumerate(calls)],
        finish_reason=finish,
        finished=finished,
    )
    collected, _ = fold(turn_as_events(turn))

    def strip(output: list) -> list:
        return [{k: v for k, v in item.items() if k != "id"} for item in output]

    assert strip(streamed.output) == strip(collected.output)
    assert streamed.response["status"] == collected.response["status"]
    deltas = "".join(p["delta"] for n, p in frames if n == "response.output_text.delta")
    assert deltas == "".join(text) == (streamed.output_text() or "")
    assert [p["sequence_number"] for _, p in frames] == list(range(len(frames)))


@pytest.mark.parametrize(
    ("fmt", "expected"),
    [
        ({"type": "text"}, None),
        ({"type": "json_object"}, {"type": "json_object"}),
        (
            {"type": "json_schema", "name": "a", "schema": WEATHER, "strict": True},
            {
                "type": "json_schema",
                "json_schema": {"name": "a", "schema": WEATHER, "strict": True},
            },
        ),
    ],
)
def test_text_format_becomes_response_format(fmt: dict, expected: dict | None) -> None:
    chat, _ = to_chat_body({"input": "x", "text": {"format": fmt}})
    assert chat.get("response_format") == expected


def test_a_running_response_reads_with_its_text_so_far_and_stops_incomplete() -> None:
    builder, _ = fold([ReasoningDelta("hmm"), TextDelta("Hel"), TextDelta("lo")])
    view = builder.view()
    assert view["status"] == "in_progress"
    assert view["output"][0]["summary"] == [{"type": "summary_text", "text": "hmm"}]
    assert view["output"][1]["content"] == [
        {"type": "output_text", "text": "Hello", "annotations": []}
    ]
    assert builder.snapshot()["output"][1]["content"] == []  # the stream's own copy
    builder.stop("cancelled")
    stopped = builder.snapshot()
    assert stopped["status"] == "cancelled"
    assert (stopped["output"][1]["status"], builder.output_text()) == ("incomplete", "Hello")


def test_a_call_stopped_mid_arguments_is_incomplete_and_no_tool_call() -> None:
    builder, _ = fold([ToolCallStart(0, "call_a", "get_weather"), ToolCallArguments(0, '{"ci')])
    assert builder.view()["output"][0]["arguments"] == '{"ci'
    builder.stop("cancelled")
    item = builder.snapshot()["output"][0]
    assert (item["status"], item["arguments"]) == ("incomplete", '{"ci')
    assert builder.tool_calls == []

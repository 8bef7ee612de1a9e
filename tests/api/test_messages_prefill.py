"""Anthropic prefill: a trailing assistant turn is continued, not closed.

Anthropic's Messages API lets the client write the start of the reply as a
final ``assistant`` message; the model continues that text. The translation
asks the template to leave the turn open (``continue_final_message``).
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest
from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer

from mlxspec.engine import PromptError
from mlxspec.engine.loop.rows import keep_leading_space
from mlxspec.engine.prompt import normalize_messages, render_chat
from mlxspec.handlers.messages.anthropic import to_chat_body
from mlxspec.handlers.requests import to_generation_request
from tests.helpers import anthropic_sdk

USER = {"role": "user", "content": "hello"}
PREFILL = {"role": "assistant", "content": "The answer is"}
#: The tiny model's ChatML rendering of USER + PREFILL with the turn left open.
OPEN = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\nThe answer is"


def body(**fields) -> dict:
    return {"model": "m", "max_tokens": 4, "messages": [USER], **fields}


@pytest.fixture()
def sdk(tiny_server) -> Iterator[anthropic.Anthropic]:
    with anthropic_sdk(tiny_server.base) as client:
        yield client


# --- translation ------------------------------------------------------------


def test_trailing_assistant_turn_is_continued() -> None:
    chat = to_chat_body(body(messages=[USER, PREFILL]))
    assert chat["messages"] == [USER, PREFILL]
    assert chat["chat_template_kwargs"] == {"continue_final_message": True}
    blocks = {"role": "assistant", "content": [{"type": "text", "text": "The answer is"}]}
    thinking = to_chat_body(body(messages=[USER, blocks], thinking={"type": "disabled"}))
    assert thinking["chat_template_kwargs"] == {
        "enable_thinking": False,
        "continue_final_message": True,
    }


def test_other_conversations_are_not_continued() -> None:
    assert "chat_template_kwargs" not in to_chat_body(body(messages=[USER, PREFILL, USER]))
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    tool_turn = {"role": "assistant", "content": [call]}
    assert "chat_template_kwargs" not in to_chat_body(body(messages=[USER, tool_turn]))


# --- rendering --------------------------------------------------------------


def test_prefill_renders_the_turn_left_open(tiny_engine) -> None:
    tokenizer = tiny_engine.tokenizer
    open_turn = tiny_engine.chat_prompt([USER, PREFILL], None, {"continue_final_message": True})
    assert open_turn == list(tokenizer.encode(OPEN, add_special_tokens=False))
    closed = tokenizer.decode(tiny_engine.chat_prompt([USER, PREFILL]))
    assert closed == OPEN + "<|im_end|>\n<|im_start|>assistant\n"  # what a prefill must not be


def test_a_template_that_drops_the_prefill_is_a_prompt_error(tiny_engine) -> None:
    drops = "{% for m in messages %}{{ m['role'] }}{% endfor %}"
    kwargs = {"chat_template": drops, "continue_final_message": True}
    messages = normalize_messages([USER, PREFILL], "m")
    with pytest.raises(PromptError) as err:
        render_chat(tiny_engine.tokenizer, messages, template_kwargs=kwargs)
    assert (err.value.message, err.value.param) == (
        "prompt build failed: the chat template cannot continue the final message",
        "messages",
    )


def test_a_continued_output_keeps_its_leading_space(tiny_engine) -> None:
    tokenizer = tiny_engine.tokenizer
    tokens = list(tokenizer.encode(" hello world", add_special_tokens=False))

    def streamed(keep: bool) -> str:
        detok = tokenizer.detokenizer
        assert isinstance(detok, BPEStreamingDetokenizer)
        if keep:
            keep_leading_space(detok)
        pieces = []
        for token in tokens:
            detok.add_token(token)
            pieces.append(detok.last_segment)
        detok.finalize()
        return "".join([*pieces, detok.last_segment])

    assert streamed(keep=False) == "hello world"  # mlx-lm's start-of-answer trim
    assert streamed(keep=True) == " hello world"


def test_the_engine_request_is_a_continuation_only_for_an_open_turn(tiny_engine) -> None:
    def request(chat: dict):
        return to_generation_request(chat, [1, 2], tiny_engine.defaults, tiny_engine.info)

    assert request(to_chat_body(body(messages=[USER, PREFILL]))).continuation is True
    assert request(to_chat_body(body(messages=[USER]))).continuation is False


# --- over HTTP --------------------------------------------------------------


def test_prefill_counts_and_runs_on_the_open_turn(sdk: anthropic.Anthropic, tiny_engine) -> None:
    expected = len(tiny_engine.tokenizer.encode(OPEN, add_special_tokens=False))
    count = sdk.messages.count_tokens(model="m", messages=[USER, PREFILL])
    assert count.input_tokens == expected
    m = sdk.messages.create(model="m", max_tokens=3, messages=[USER, PREFILL])
    assert m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0) == expected
    with sdk.messages.stream(model="m", max_tokens=3, messages=[USER, PREFILL]) as stream:
        final = stream.get_final_message()
    assert final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0) == expected


def test_chat_completions_continue_on_request(client, tiny_engine) -> None:
    expected = len(tiny_engine.tokenizer.encode(OPEN, add_special_tokens=False))
    kwargs = {"continue_final_message": True}
    body = {"messages": [USER, PREFILL], "max_tokens": 2, "chat_template_kwargs": kwargs}
    r = client.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == expected

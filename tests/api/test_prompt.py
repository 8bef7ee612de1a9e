"""Prompt building: message normalisation, BOS de-duplication, templates."""

from __future__ import annotations

import pytest

from mlxspec.engine.prompt import dedupe_bos, normalize_messages, render_chat
from mlxspec.engine.types import PromptError


def test_normalize_joins_text_parts_and_nulls() -> None:
    msgs = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}
            ],
        },
    ]
    out = normalize_messages(msgs, "m")
    assert out[0]["content"] == "ab"
    assert out[1]["content"] == ""
    assert out[1]["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert msgs[1]["content"] is None  # input untouched
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == '{"x": 1}'


def test_unparseable_arguments_stay_strings() -> None:
    msgs = [
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": "not json"}}],
        }
    ]
    assert normalize_messages(msgs, "m")[0]["tool_calls"][0]["function"]["arguments"] == "not json"


@pytest.mark.parametrize("kind", ["image_url", "input_audio", "video_url"])
def test_media_parts_rejected_naming_model(kind: str) -> None:
    msgs = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": kind}]}]
    with pytest.raises(PromptError, match="model my-model is text-only") as err:
        normalize_messages(msgs, "my-model")
    assert err.value.param == "messages[0].content[1]"


def test_unknown_part_type_rejected() -> None:
    with pytest.raises(PromptError) as err:
        normalize_messages([{"role": "user", "content": [{"type": "blob"}]}], "m")
    assert (err.value.message, err.value.param) == (
        "unsupported content part type 'blob': a prompt here holds text (and images or audio "
        "on a model that reads them)",
        "messages[0].content[0]",
    )


def test_dedupe_bos() -> None:
    assert dedupe_bos([1, 1, 5], 1) == [1, 5]
    assert dedupe_bos([1, 5], 1) == [1, 5]
    assert dedupe_bos([1, 1], None) == [1, 1]


class FakeTokenizer:
    """Implements the two methods render_chat uses; the template doubles BOS."""

    chat_template = "x"
    bos_token_id = 1

    def apply_chat_template(
        self, messages, tools=None, add_generation_prompt=True, tokenize=False, **kw
    ):
        if kw.get("explode"):
            raise ValueError("template says no")
        return "<s>" + "|".join(m["content"] for m in messages)

    def encode(self, text, add_special_tokens=True):
        assert add_special_tokens is False
        return [1, 1] + [ord(c) for c in text[3:]]


def test_render_chat_removes_doubled_bos_and_wraps_template_errors() -> None:
    assert render_chat(FakeTokenizer(), [{"content": "a"}]) == [1, ord("a")]
    with pytest.raises(PromptError, match="prompt build failed: template says no"):
        render_chat(FakeTokenizer(), [{"content": "a"}], template_kwargs={"explode": True})


def test_no_template_is_a_prompt_error() -> None:
    tok = FakeTokenizer()
    tok.chat_template = None
    with pytest.raises(PromptError, match="no chat template"):
        render_chat(tok, [])


TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object"}},
}


def test_tools_reach_a_template_that_ignores_them_as_a_system_message(tiny_engine) -> None:
    # A fresh user found the embedded model's template silently dropping `tools`.
    from mlxspec.engine.prompt import template_renders_tools, with_tool_instruction

    tok = tiny_engine.tokenizer
    assert not template_renders_tools(tok.chat_template)
    user = [{"role": "user", "content": "hi"}]
    ids = tiny_engine.chat_prompt(user, [TOOL])
    text = tok.decode(ids)
    assert text.startswith(
        '<|im_start|>system\nFunctions you may call:\n[{"name":"get_weather",'
        '"parameters":{"type":"object"}}]\nTo call one, reply <tool_call>'
    )
    assert len(ids) > len(tiny_engine.chat_prompt(user))
    merged = with_tool_instruction([{"role": "system", "content": "Be brief."}, *user], [TOOL])
    assert merged[0]["content"].startswith("Be brief.\n\nFunctions you may call:")
    assert merged[1:] == user


def test_a_template_that_renders_tools_gets_them_as_is() -> None:
    from mlxspec.engine.prompt import template_renders_tools

    assert template_renders_tools("{% for t in tools %}{{ t }}{% endfor %}")

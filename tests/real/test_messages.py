"""``/v1/messages`` through the official ``anthropic`` SDK on the embedded
SmolLM2-135M-Instruct model, where the text must mean something: an answer
(streamed and not), a prefill continued, and ``messages.parse`` filling a typed
object (chat's grammar mask on the Anthropic surface).
"""

from __future__ import annotations

from collections.abc import Iterator

import anthropic
import pytest
from pydantic import BaseModel

from tests.helpers import anthropic_sdk

GREEDY = {"temperature": 0}


@pytest.mark.real_model
def test_real_model_answers_through_the_sdk(real_server: str) -> None:
    question = [{"role": "user", "content": "What is the capital of France?"}]
    with anthropic_sdk(real_server, timeout=120) as sdk:
        m = sdk.messages.create(model="m", max_tokens=12, messages=question, extra_body=GREEDY)
        with sdk.messages.stream(
            model="m", max_tokens=12, messages=question, extra_body=GREEDY
        ) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
    assert "Paris" in m.content[0].text
    assert m.model == "SmolLM2-135M-Instruct"
    assert text == m.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (m.stop_reason, m.usage.output_tokens)


def test_real_model_continues_the_prefill(real_server: str) -> None:
    messages = [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "The capital of France is"},
    ]
    with anthropic_sdk(real_server, timeout=120) as sdk:
        m = sdk.messages.create(
            model="m", max_tokens=3, messages=messages, extra_body={"temperature": 0}
        )
    # The reply goes on from "is"; a new turn would restate the sentence instead.
    assert m.content[0].text.startswith(" Paris")


class Capital(BaseModel):
    """What ``messages.parse`` should fill from the reply."""

    country: str
    capital: str


@pytest.fixture()
def real_sdk(real_server: str) -> Iterator[anthropic.Anthropic]:
    with anthropic_sdk(real_server, timeout=120) as client:
        yield client


@pytest.mark.real_model
def test_real_model_parse_gives_a_typed_object(real_sdk: anthropic.Anthropic) -> None:
    question = [{"role": "user", "content": "What is the capital of France? Answer as JSON."}]
    parsed = real_sdk.messages.parse(
        model="m",
        max_tokens=40,
        messages=question,
        output_format=Capital,
        extra_body={"temperature": 0},
    )
    out = parsed.parsed_output
    assert isinstance(out, Capital)
    assert "Paris" in out.capital
    assert parsed.stop_reason == "end_turn"

"""``/v1/responses`` through the official ``openai`` SDK against a live
``mlxspec serve`` on the embedded SmolLM2-135M-Instruct model: meaningful text,
streamed and not, and a continuation through ``previous_response_id``.
Outputs stay at most 16 tokens (CPU decoding is slow)."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from tests.helpers import openai_sdk

pytestmark = pytest.mark.real_model

GREEDY = {"model": "m", "temperature": 0, "max_output_tokens": 16}


@pytest.fixture(scope="module")
def sdk(real_server: str) -> Iterator[openai.OpenAI]:
    with openai_sdk(real_server, timeout=120) as client:
        yield client


def test_answers_paris_and_the_stream_says_the_same(sdk: openai.OpenAI) -> None:
    r = sdk.responses.create(input="What is the capital of France?", **GREEDY)
    assert "Paris" in r.output_text
    assert r.status in {"completed", "incomplete"} and r.model == "SmolLM2-135M-Instruct"
    assert 1 <= r.usage.output_tokens <= 16
    events = list(
        sdk.responses.create(input="What is the capital of France?", stream=True, **GREEDY)
    )
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == r.output_text
    assert events[-1].response.usage.output_tokens == r.usage.output_tokens


def test_a_continuation_sees_the_first_turn(sdk: openai.OpenAI) -> None:
    first = sdk.responses.create(
        input="What is the capital of France?",
        instructions="Answer in one short sentence.",
        **GREEDY,
    )
    second = sdk.responses.create(input="And of Italy?", previous_response_id=first.id, **GREEDY)
    assert "Rome" in second.output_text
    assert second.instructions == "Answer in one short sentence."
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 1

"""The official ``openai`` SDK against a live ``mlxspec serve`` on the embedded
SmolLM2-135M-Instruct model (started as a user would, in a subprocess).

CPU decoding runs at roughly 10 tokens/s, so outputs stay short.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def sdk(real_server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{real_server}/v1", api_key="not-needed", max_retries=0)


def test_greedy_chat_answers_paris(sdk: openai.OpenAI) -> None:
    r = sdk.chat.completions.create(
        model="anything", messages=QUESTION, temperature=0, max_tokens=20
    )
    content = r.choices[0].message.content
    assert "Paris" in content
    assert r.model == "SmolLM2-135M-Instruct"
    assert r.usage.prompt_tokens > 10 and 1 <= r.usage.completion_tokens <= 20
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_streamed_deltas_equal_non_streamed(sdk: openai.OpenAI) -> None:
    kwargs = dict(model="m", messages=QUESTION, temperature=0, max_tokens=20)
    whole = sdk.chat.completions.create(**kwargs)
    stream = sdk.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    *chunks, usage = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    assert usage.usage.completion_tokens == whole.usage.completion_tokens


def test_text_completion(sdk: openai.OpenAI) -> None:
    r = sdk.completions.create(
        model="m", prompt="The capital of France is", max_tokens=5, temperature=0
    )
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason in {"stop", "length"}
    assert "Paris" in r.choices[0].text


def test_models_list(sdk: openai.OpenAI) -> None:
    models = sdk.models.list()
    served = [m.id for m in models.data if getattr(m, "tier", None) is None]
    assert served == ["SmolLM2-135M-Instruct"]  # the library's models on disk follow
    assert models.data[0].owned_by == "mlxspec"


def test_sdk_raises_bad_request_with_openai_body(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model="m", messages=[], max_tokens=1)
    assert err.value.body["message"] == "messages required"
    assert err.value.body["param"] == "messages"


def test_stop_sequence_on_real_model(sdk: openai.OpenAI) -> None:
    base = dict(model="m", messages=QUESTION, temperature=0, max_tokens=20)
    full = sdk.chat.completions.create(**base).choices[0].message.content
    stop = "capital"
    assert stop in full
    r = sdk.chat.completions.create(**base, stop=[stop])
    assert r.choices[0].message.content == full[: full.find(stop)]
    assert r.choices[0].finish_reason == "stop"


def test_async_client_streams(real_server: str) -> None:
    async def go() -> str:
        client = openai.AsyncOpenAI(base_url=f"{real_server}/v1", api_key="x", max_retries=0)
        stream = await client.chat.completions.create(
            model="m", messages=QUESTION, temperature=0, max_tokens=8, stream=True
        )
        text = ""
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        await client.close()
        return text

    assert len(asyncio.run(go())) > 0

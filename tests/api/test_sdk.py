"""The official ``openai`` SDK (sync and async, streamed and not) against the
tiny random model on a live server.

The SDK's HTTP clients are contract-checking httpx clients, so every response
the SDK parses is also checked against the OpenAPI document. Outputs are made
deterministic with greedy decoding, a fixed ``max_tokens`` and the EOS token
forbidden. ``tests/real/test_sdk.py`` covers the real model.
"""

from __future__ import annotations

import asyncio

import openai
import pytest

from mlxspec.conformance.httpx_checks import checking_async_client

NO_EOS = {"2": -1e9}  # the tiny model's EOS id
MESSAGES = [{"role": "user", "content": "hello"}]
FIXED = {"model": "any", "max_tokens": 8, "temperature": 0, "logit_bias": NO_EOS}


def async_sdk(tiny_server) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{tiny_server.base}/v1",
        api_key="not-needed",
        max_retries=0,
        http_client=checking_async_client(timeout=60),
    )


def test_chat_completion(sdk: openai.OpenAI) -> None:
    r = sdk.chat.completions.create(messages=MESSAGES, **FIXED)
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.model == "tiny-llama"
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8


def test_chat_stream_deltas_equal_the_non_streamed_text(sdk: openai.OpenAI) -> None:
    whole = sdk.chat.completions.create(messages=MESSAGES, **FIXED)
    chunks = list(
        sdk.chat.completions.create(
            messages=MESSAGES, stream=True, stream_options={"include_usage": True}, **FIXED
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert {c.id for c in chunks} == {chunks[0].id}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    # include_usage: OpenAI's usage chunk of its own, after the finishing chunk
    assert chunks[-2].choices[0].finish_reason == "length" and chunks[-2].usage is None
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens == 8


@pytest.mark.parametrize("include_usage", [True, False, None])
def test_a_client_summing_stream_usage_counts_it_once(
    sdk: openai.OpenAI, include_usage: bool | None
) -> None:
    """Usage on one chunk only, its own, when asked (``include_usage: true``);
    on none otherwise (OpenAI's contract), for chat and text completions."""
    options = {} if include_usage is None else {"stream_options": {"include_usage": include_usage}}
    for create, ask in (
        (sdk.chat.completions.create, {"messages": MESSAGES}),
        (sdk.completions.create, {"prompt": "hello"}),
    ):
        whole = create(**ask, **FIXED)
        chunks = list(create(**ask, stream=True, **options, **FIXED))
        counted = [c.usage.completion_tokens for c in chunks if c.usage is not None]
        assert counted == ([whole.usage.completion_tokens] if include_usage else [])
        assert (chunks[-1].choices == []) is (include_usage is True)


def test_text_completion_stream_equals_non_stream(sdk: openai.OpenAI) -> None:
    whole = sdk.completions.create(prompt="hello", **FIXED)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    asked = {"stream": True, "stream_options": {"include_usage": True}}
    *chunks, usage = list(sdk.completions.create(prompt="hello", **asked, **FIXED))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert usage.usage.completion_tokens == whole.usage.completion_tokens


def test_models_list(sdk: openai.OpenAI) -> None:
    models = sdk.models.list()
    # the served model (the library's models on disk follow it, with a tier)
    assert [m.id for m in models.data if getattr(m, "tier", None) is None] == ["tiny-llama"]
    assert models.data[0].owned_by == "mlxspec"
    assert models.data[0].model_extra["context_window"] == 256


def test_models_retrieve_gives_a_model_and_404_for_unknown_ids(sdk: openai.OpenAI) -> None:
    found = sdk.models.retrieve("tiny-llama")
    assert (found.id, found.object, found.owned_by) == ("tiny-llama", "model", "mlxspec")
    with pytest.raises(openai.NotFoundError) as err:
        sdk.models.retrieve("other")
    assert err.value.body["param"] == "model_id"


def test_bad_request_error_carries_the_openai_body(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model="m", messages=[])
    assert err.value.status_code == 400
    assert err.value.body == {
        "message": "messages required",
        "type": "invalid_request_error",
        "param": "messages",
        "code": None,
    }
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model="m", prompt="x", extra_body={"top_logprobs": 12})
    assert err.value.body["message"] == "top_logprobs must be at most 11"
    # The SDK's legacy integer `logprobs` is refused: mlx-lm's is a boolean (docs/deviations.md).
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model="m", prompt="x", logprobs=2)
    assert err.value.body["param"] == "logprobs"


def test_raw_response_headers(sdk: openai.OpenAI) -> None:
    raw = sdk.chat.completions.with_raw_response.create(messages=MESSAGES, **FIXED)
    assert raw.status_code == 200
    assert raw.headers["content-type"].startswith("application/json")
    assert raw.parse().usage.completion_tokens == 8
    raw = sdk.chat.completions.with_raw_response.create(messages=MESSAGES, stream=True, **FIXED)
    assert raw.headers["content-type"].startswith("text/event-stream")
    assert raw.headers["cache-control"] == "no-cache"
    assert raw.headers["x-accel-buffering"] == "no"
    assert len([c for c in raw.parse() if c.choices[0].delta.content]) >= 1


def test_async_client(tiny_server) -> None:
    async def go() -> None:
        async with async_sdk(tiny_server) as client:
            whole = await client.chat.completions.create(messages=MESSAGES, **FIXED)
            stream = await client.chat.completions.create(messages=MESSAGES, stream=True, **FIXED)
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
            assert text == whole.choices[0].message.content
            completion = await client.completions.create(prompt="hello", **FIXED)
            pieces = await client.completions.create(prompt="hello", stream=True, **FIXED)
            joined = "".join([c.choices[0].text async for c in pieces])
            assert joined == completion.choices[0].text
            listed = [m async for m in client.models.list()]
            assert [m.id for m in listed if getattr(m, "tier", None) is None] == ["tiny-llama"]
            with pytest.raises(openai.BadRequestError):
                await client.chat.completions.create(model="m", messages=[])

    asyncio.run(go())

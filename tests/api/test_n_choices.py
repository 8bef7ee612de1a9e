"""``n`` choices per request on chat and text completions (tiny random model),
and the completion fields that are refused rather than silently ignored."""

from __future__ import annotations

import json
import time
from collections import defaultdict

import httpx
import openai
import pytest

from mlxspec.engine import Finished, GenerationRequest, SamplingParams
from mlxspec.handlers.chat.choices import choices_usage
from mlxspec.handlers.requests import choice_request
from tests.helpers import assert_invalid_request

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
NO_EOS = {"2": -1e9}  # the tiny model's EOS id
MESSAGES = [{"role": "user", "content": "hello"}]
ROUTES = [(CHAT, {"messages": MESSAGES}), (COMP, {"prompt": "hello"})]


def text_of(path: str, choice: dict) -> str:
    return choice["message"]["content"] if path == CHAT else choice["text"]


def test_choice_seeds_are_offset_and_wrap() -> None:
    base = GenerationRequest(prompt=(1,), sampling=SamplingParams(seed=2**64 - 1))
    assert choice_request(base, 0) is base
    assert choice_request(base, 1).sampling.seed == 0
    assert choice_request(base, 3).sampling.seed == 2
    unseeded = GenerationRequest(prompt=(1,))
    assert choice_request(unseeded, 2) is unseeded


def test_usage_counts_the_prompt_once() -> None:
    finished = [Finished("stop", 10, 3, 4, "serial"), Finished("length", 10, 5, 0, "batched")]
    assert choices_usage(finished) == {
        "prompt_tokens": 10,
        "completion_tokens": 8,
        "total_tokens": 18,
        "prompt_tokens_details": {"cached_tokens": 4},
        "lane": "batched",
    }


@pytest.mark.parametrize("path,prompt", ROUTES)
def test_greedy_n_gives_identical_choices(client: httpx.Client, path, prompt) -> None:
    body = {**prompt, "max_tokens": 5, "logit_bias": NO_EOS}
    one = client.post(path, json=body).json()
    many = client.post(path, json={**body, "n": 3}).json()
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    assert [text_of(path, c) for c in many["choices"]] == [text_of(path, one["choices"][0])] * 3
    assert [c["finish_reason"] for c in many["choices"]] == ["length"] * 3
    assert many["usage"]["prompt_tokens"] == one["usage"]["prompt_tokens"]
    assert many["usage"]["completion_tokens"] == 15
    assert many["usage"]["total_tokens"] == one["usage"]["prompt_tokens"] + 15


@pytest.mark.parametrize("path,prompt", ROUTES)
def test_seeded_choices_differ_and_reproduce(client: httpx.Client, path, prompt) -> None:
    body = {**prompt, "max_tokens": 8, "logit_bias": NO_EOS, "temperature": 50.0, "seed": 11}
    first = client.post(path, json={**body, "n": 3}).json()
    texts = [text_of(path, c) for c in first["choices"]]
    assert len(set(texts)) == 3
    again = client.post(path, json={**body, "n": 3}).json()
    assert [text_of(path, c) for c in again["choices"]] == texts
    # Choice 0 is the request with that seed; choice 1 the one with seed + 1.
    alone = client.post(path, json={**body, "seed": 12}).json()
    assert text_of(path, alone["choices"][0]) == texts[1]


def test_each_choice_has_its_own_finish_reason(client: httpx.Client) -> None:
    # Near-uniform sampling with EOS favoured: seeded choices end at different steps.
    body = {"prompt": "hello", "max_tokens": 6, "temperature": 50.0, "seed": 5, "n": 4}
    body |= {"logit_bias": {"2": 230.0}, "logprobs": True}  # ~ +4.6 after temperature
    r = client.post(COMP, json=body).json()
    lengths = []
    for choice in r["choices"]:
        ids = [e["id"] for e in choice["logprobs"]["content"]]
        lengths.append(len(ids))
        expected = "stop" if ids[-1] == 2 else "length"
        assert choice["finish_reason"] == expected
        assert expected == "stop" or len(ids) == 6
    assert {c["finish_reason"] for c in r["choices"]} == {"stop", "length"}
    assert r["usage"]["completion_tokens"] == sum(lengths)


def stream_by_index(r: httpx.Response) -> tuple[dict, dict, list[dict]]:
    assert r.status_code == 200, r.text
    data = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    texts: dict[int, list[str]] = defaultdict(list)
    reasons: dict[int, list[str]] = defaultdict(list)
    for chunk in chunks:
        assert len(chunk["choices"]) == 1
        choice = chunk["choices"][0]
        piece = choice["delta"].get("content") if "delta" in choice else choice["text"]
        texts[choice["index"]].append(piece or "")
        if choice["finish_reason"] is not None:
            reasons[choice["index"]].append(choice["finish_reason"])
    return {i: "".join(t) for i, t in texts.items()}, reasons, chunks


@pytest.mark.parametrize("path,prompt", ROUTES)
def test_streamed_choices_carry_their_index(client: httpx.Client, path, prompt) -> None:
    body = {**prompt, "max_tokens": 5, "logit_bias": NO_EOS, "temperature": 50.0, "seed": 3}
    whole = client.post(path, json={**body, "n": 2}).json()
    texts, reasons, chunks = stream_by_index(
        client.post(path, json={**body, "n": 2, "stream": True})
    )
    assert texts == {c["index"]: text_of(path, c) for c in whole["choices"]}
    assert reasons == {0: ["length"], 1: ["length"]}
    # unasked, no chunk carries usage (OpenAI's contract); asked, one chunk of its
    # own after the last choice's finish does, summed over choices.
    assert [c for c in chunks if "usage" in c] == []
    asked = {**body, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    r = client.post(path, json=asked)
    lines = [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]
    usage = [json.loads(d) for d in lines[:-1]]
    assert [i for i, c in enumerate(usage) if "usage" in c] == [len(usage) - 1]
    assert usage[-1]["choices"] == []
    assert usage[-1]["usage"]["completion_tokens"] == 10
    assert usage[-1]["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"]
    if path == CHAT:
        roles = [c["choices"][0]["index"] for c in chunks if "role" in c["choices"][0]["delta"]]
        assert sorted(roles) == [0, 1]


def test_sdk_parses_n_choices(sdk: openai.OpenAI) -> None:
    r = sdk.chat.completions.create(
        model="any", messages=MESSAGES, n=2, max_tokens=3, logit_bias=NO_EOS
    )
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].message.content == r.choices[1].message.content
    assert r.usage.completion_tokens == 6


@pytest.mark.parametrize("path,prompt", ROUTES)
@pytest.mark.parametrize(
    "value,message",
    [(0, "n must be at least 1"), (17, "n must be at most 16"), ("2", "n must be of type int")],
)
def test_n_bounds(client: httpx.Client, path, prompt, value, message) -> None:
    assert_invalid_request(client.post(path, json={**prompt, "n": value}), "n", message)


@pytest.mark.parametrize(
    "field,value,message",
    [
        ("best_of", 2, "best_of is not supported; use n to get several choices"),
        (
            "echo",
            True,
            "echo is not supported (the reply holds only the completion, as with mlx_lm.server)",
        ),
        ("suffix", "end", "suffix is not supported (no fill-in-the-middle)"),
    ],
)
def test_unsupported_completion_fields_are_refused(
    client: httpx.Client, field, value, message
) -> None:
    assert_invalid_request(client.post(COMP, json={"prompt": "hi", field: value}), field, message)


def test_neutral_values_of_unsupported_fields_are_accepted(client: httpx.Client) -> None:
    body = {"prompt": "hi", "max_tokens": 1, "best_of": 1, "echo": False, "suffix": ""}
    assert client.post(COMP, json=body).status_code == 200
    nulls = {"prompt": "hi", "max_tokens": 1, "best_of": None, "echo": None, "suffix": None}
    assert client.post(COMP, json=nulls).status_code == 200


@pytest.mark.parametrize("stream", [False, True])
def test_disconnect_cancels_every_choice(tiny_server, tiny_engine, client, stream) -> None:
    before = tiny_engine.counters["cancelled"]
    body = {"messages": MESSAGES, "n": 3, "logit_bias": NO_EOS, "stream": stream}
    if stream:
        with (
            httpx.Client(base_url=tiny_server.base, timeout=30) as c,
            c.stream("POST", CHAT, json=body) as r,
        ):
            lines = r.iter_lines()
            assert any(next(lines).startswith("data: ") for _ in range(4))
    else:
        with pytest.raises(httpx.ReadTimeout):  # runs to the context window unless cancelled
            httpx.post(f"{tiny_server.base}{CHAT}", json=body, timeout=0.15)
    deadline = time.monotonic() + 10
    while tiny_engine.counters["cancelled"] < before + 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tiny_engine.counters["cancelled"] == before + 3
    assert (
        client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 2, "n": 2}).status_code == 200
    )


def test_merge_interleaves_and_stops_every_stream_on_an_error() -> None:
    import asyncio

    from mlxspec.handlers.chat.choices import merge

    stopped: list[int] = []

    async def numbers(index: int, count: int, fail: bool = False):
        try:
            for i in range(count):
                await asyncio.sleep(0.001 * (index + 1))
                yield i
            if fail:
                raise ValueError("boom")
            await asyncio.sleep(10)  # a slow stream, still running when another fails
        finally:
            stopped.append(index)

    async def run(streams) -> list:
        return [item async for item in merge(streams)]

    async def failing() -> list[int]:
        with pytest.raises(ValueError, match="boom"):
            await run([numbers(0, 3, fail=True), numbers(1, 2)])
        await asyncio.sleep(0.05)  # far less than the slow stream's 10 s
        return sorted(stopped)

    assert asyncio.run(failing()) == [0, 1]

    async def finite(index: int, count: int):
        for i in range(count):
            await asyncio.sleep(0)
            yield f"{index}:{i}"

    items = asyncio.run(run([finite(0, 3), finite(1, 2)]))
    assert sorted(items) == [(0, "0:0"), (0, "0:1"), (0, "0:2"), (1, "1:0"), (1, "1:1")]
    assert [i for i in items if i[0] == 0] == [(0, "0:0"), (0, "0:1"), (0, "0:2")]


def test_fuzz_hooks_keep_n_small() -> None:
    from mlxspec.conformance.hooks import cap_choices, cheap_generation_body

    assert cap_choices({"n": 16, "prompt": "a"}) == {"n": 2, "prompt": "a"}
    for body in ({"n": 2}, {"n": 0}, {"n": "9"}, {"n": None}, {}, [1]):
        assert cap_choices(body) is body
    assert cheap_generation_body({"prompt": "a", "n": 9})["n"] == 2

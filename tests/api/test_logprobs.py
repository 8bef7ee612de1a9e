"""Logprobs in both ``--logprobs-format``s, on the tiny random model.

The default (``mlx``) is mlx_lm.server's block, on non-streamed choices only;
``openai`` is OpenAI's chat and legacy completion shapes, on stream chunks
too, parsed here by the official SDK into its typed objects. Every response
is checked against the OpenAPI document (``client`` and the SDK's checking
httpx client).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator

import httpx
import openai
import pytest

from mlxspec.engine import TokenLogprob, TopLogprob
from mlxspec.engine.types import GenerationRequest
from mlxspec.handlers.chat.logprobs import CompletionLogprobs, token_text
from tests.helpers import assert_invalid_request, openai_sdk

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"
EOS = 2  # the tiny model's <|im_end|>
NO_EOS = {str(EOS): -1e9}
C3 = 130  # the tiny model's byte token 0xC3: the first byte of a 2-byte character
MESSAGES = [{"role": "user", "content": "hello"}]


def sse_data(r: httpx.Response) -> list[str]:
    return [line[6:] for line in r.text.split("\n") if line.startswith("data: ")]


@pytest.fixture()
def sdk(openai_server) -> Iterator[openai.OpenAI]:
    with openai_sdk(openai_server.base) as client:
        yield client


# --- pure pieces --------------------------------------------------------------


def test_token_text_marks_partial_utf8_as_openai_does() -> None:
    assert token_text(b" hello") == " hello"
    assert token_text("é".encode()) == "é"
    assert token_text(b"\xc3") == "bytes:\\xc3"
    assert token_text(b"\xe4\xb8") == "bytes:\\xe4\\xb8"


def test_completion_text_offset_counts_whole_characters_across_chunks() -> None:
    request = GenerationRequest(prompt=(1,), logprobs=True)
    lp = CompletionLogprobs(request, "openai")
    first = lp.chunk(
        [TokenLogprob(5, -0.5, token_bytes=b"h"), TokenLogprob(130, -1.0, (), b"\xc3")]
    )
    second = lp.chunk([TokenLogprob(105, -2.0, (), b"\xa9"), TokenLogprob(6, -3.0, (), b"x")])
    assert first == {
        "tokens": ["h", "bytes:\\xc3"],
        "token_logprobs": [-0.5, -1.0],
        "top_logprobs": None,
        "text_offset": [0, 1],
    }
    # "é" is one character: the token finishing it starts at its offset.
    assert second["text_offset"] == [1, 2]
    assert second["tokens"] == ["bytes:\\xa9", "x"]


def test_completion_top_logprobs_map_text_to_logprob() -> None:
    request = GenerationRequest(prompt=(1,), top_logprobs=2)
    top = (TopLogprob(7, "a", -0.1, b"a"), TopLogprob(8, "b", -2.5, b"b"))
    block = CompletionLogprobs(request, "openai").whole([TokenLogprob(7, -0.1, top, b"a")])
    assert block["top_logprobs"] == [{"a": -0.1, "b": -2.5}]
    assert CompletionLogprobs(GenerationRequest(prompt=(1,)), "openai").whole([]) is None


def test_format_flag_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlxspec.cli.flags import parse_config

    monkeypatch.delenv("MLXSPEC_LOGPROBS_FORMAT", raising=False)
    assert parse_config(["serve"]).logprobs_format == "mlx"
    assert parse_config(["serve", "--logprobs-format", "openai"]).logprobs_format == "openai"
    monkeypatch.setenv("MLXSPEC_LOGPROBS_FORMAT", "openai")
    assert parse_config(["serve"]).logprobs_format == "openai"
    assert parse_config(["serve", "--logprobs-format", "mlx"]).logprobs_format == "mlx"
    for argv, env in ((["serve", "--logprobs-format", "vllm"], "mlx"), (["serve"], "json")):
        monkeypatch.setenv("MLXSPEC_LOGPROBS_FORMAT", env)
        with pytest.raises(SystemExit) as err:
            parse_config(argv)
        assert err.value.code == 2


class FakeVocab:
    """A tokenizer stand-in with a fixed vocabulary of raw pieces."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces

    def __len__(self) -> int:
        return len(self.pieces)

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.pieces[i] for i in ids]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.pieces[i] for i in ids).replace("|", "")


def test_piece_bytes_per_tokenizer_family() -> None:
    from mlx_lm.tokenizer_utils import BPEStreamingDetokenizer, SPMStreamingDetokenizer

    from mlxspec.engine.loop.rows import piece_bytes

    spm = FakeVocab(["\u2581Hello", "<0xE4>", "world", "<s>"])
    detok = SPMStreamingDetokenizer(spm)
    got = [piece_bytes(detok, spm, i, p) for i, p in enumerate(spm.pieces)]
    assert got == [b" Hello", b"\xe4", b"world", b"<s>"]
    bpe = FakeVocab(["\u0120hello", "\u00c3", "<|im_end|>"])  # GPT-2 byte-level pieces
    detok = BPEStreamingDetokenizer(bpe)
    got = [piece_bytes(detok, bpe, i, p) for i, p in enumerate(bpe.pieces)]
    assert got == [b" hello", b"\xc3", b"<|im_end|>"]
    assert piece_bytes(detok, bpe, 9, None) == b""  # past the vocabulary
    naive = FakeVocab(["a|b"])
    assert piece_bytes(object(), naive, 0, "a|b") == b"ab"  # any other detokenizer: decode


# --- the default: mlx_lm.server's block ----------------------------------------


@pytest.mark.parametrize("path,prompt", [(CHAT, {"messages": MESSAGES}), (COMP, {"prompt": "hi"})])
def test_mlx_block_top_sorted_and_entry_is_the_argmax(client: httpx.Client, path, prompt) -> None:
    body = {**prompt, "max_tokens": 4, "top_logprobs": 5, "logit_bias": NO_EOS}
    r = client.post(path, json=body).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert len(content) == r["usage"]["completion_tokens"] == 4
    for entry in content:
        top = entry["top_logprobs"]
        assert len(top) == 5 and set(top[0]) == {"id", "token", "logprob"}
        values = [t["logprob"] for t in top]
        assert values == sorted(values, reverse=True)
        assert entry == {**top[0], "top_logprobs": top}
    # Greedy: every generated token is the top candidate.
    plain = client.post(path, json={**body, "top_logprobs": -1, "logprobs": True}).json()
    ids = [e["id"] for e in plain["choices"][0]["logprobs"]["content"]]
    assert ids == [e["id"] for e in content]
    assert set(plain["choices"][0]["logprobs"]["content"][0]) == {"id", "logprob"}


def test_mlx_distribution_is_after_logits_processors(client: httpx.Client) -> None:
    # A +40 bias makes token 100 near-certain in the reported distribution.
    r = client.post(
        COMP, json={"prompt": "hi", "max_tokens": 3, "logprobs": True, "logit_bias": {"100": 40}}
    ).json()
    content = r["choices"][0]["logprobs"]["content"]
    assert [e["id"] for e in content] == [100, 100, 100]
    assert all(-1e-3 < e["logprob"] <= 0 for e in content)


def test_mlx_distribution_is_before_the_sampler(client: httpx.Client) -> None:
    body = {"prompt": "hi", "max_tokens": 1, "top_logprobs": 3, "logit_bias": NO_EOS}
    greedy = client.post(COMP, json=body).json()["choices"][0]["logprobs"]["content"][0]
    # top_k=1 and a temperature change what is sampled, never the reported distribution.
    sampled = client.post(COMP, json={**body, "temperature": 3.0, "top_k": 1, "seed": 7}).json()
    entry = sampled["choices"][0]["logprobs"]["content"][0]
    assert [t["id"] for t in entry["top_logprobs"]] == [t["id"] for t in greedy["top_logprobs"]]
    for a, b in zip(entry["top_logprobs"], greedy["top_logprobs"], strict=True):
        assert math.isclose(a["logprob"], b["logprob"], abs_tol=1e-4)
        assert a["logprob"] > -1000  # the whole vocabulary, not top_k's -inf


def test_mlx_streams_carry_no_logprobs(client: httpx.Client) -> None:
    body = {"messages": MESSAGES, "max_tokens": 3, "logprobs": True, "stream": True}
    chunks = [json.loads(d) for d in sse_data(client.post(CHAT, json=body))[:-1]]
    assert chunks and all(c["choices"][0]["logprobs"] is None for c in chunks)


def test_not_requested_is_null_and_minus_one_is_unset(client: httpx.Client) -> None:
    for extra in ({}, {"top_logprobs": -1}, {"logprobs": False, "top_logprobs": 0}):
        r = client.post(COMP, json={"prompt": "hi", "max_tokens": 1, **extra})
        assert r.json()["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("path,prompt", [(CHAT, {"messages": MESSAGES}), (COMP, {"prompt": "hi"})])
@pytest.mark.parametrize(
    "field,value,message",
    [
        ("logprobs", 1, "logprobs must be of type bool"),
        ("logprobs", "yes", "logprobs must be of type bool"),
        ("top_logprobs", "3", "top_logprobs must be of type int"),
        ("top_logprobs", 2.5, "top_logprobs must be of type int"),
        ("top_logprobs", -2, "top_logprobs must be at least 0"),
        ("top_logprobs", 12, "top_logprobs must be at most 11"),
        ("top_logprobs", 20, "top_logprobs must be at most 11"),
    ],
)
def test_mlx_invalid_values_get_mlx_lm_messages(
    client: httpx.Client, path, prompt, field, value, message
) -> None:
    assert_invalid_request(client.post(path, json={**prompt, field: value}), field, message)


# --- --logprobs-format openai ----------------------------------------------------


def test_served_document_states_each_format_limit(client: httpx.Client, oclient) -> None:
    def top_logprobs(c: httpx.Client) -> dict:
        doc = c.get("/openapi.json").json()
        return doc["components"]["schemas"]["GenerationParameters"]["properties"]["top_logprobs"]

    mlx, oai = top_logprobs(client), top_logprobs(oclient)
    assert (mlx["maximum"], oai["maximum"]) == (11, 20)
    assert oai["x-mlxspec-error"]["maximum"] == "top_logprobs must be at most 20"
    assert "x-mlxspec-logprobs-openai" not in mlx and "x-mlxspec-logprobs-openai" not in oai


def test_openai_limits(oclient: httpx.Client) -> None:
    body = {"messages": MESSAGES, "max_tokens": 1, "logprobs": True, "top_logprobs": 20}
    ok = oclient.post(CHAT, json=body)
    assert len(ok.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20
    r = oclient.post(CHAT, json={"messages": MESSAGES, "logprobs": True, "top_logprobs": 21})
    assert_invalid_request(r, "top_logprobs", "top_logprobs must be at most 20")
    r = oclient.post(CHAT, json={"messages": MESSAGES, "logprobs": 2})
    assert_invalid_request(r, "logprobs", "logprobs must be of type bool")
    r = oclient.post(COMP, json={"prompt": "hi", "logprobs": 6})
    assert_invalid_request(r, "logprobs", "logprobs must be at most 5")
    r = oclient.post(COMP, json={"prompt": "hi", "logprobs": "2"})
    assert_invalid_request(r, "logprobs", "logprobs must be of type bool or int")


NEEDS_LOGPROBS = (
    "Invalid value for 'top_logprobs': logprobs must be true when top_logprobs is used."
)


@pytest.mark.parametrize("path,prompt", [(CHAT, {"messages": MESSAGES}), (COMP, {"prompt": "hi"})])
@pytest.mark.parametrize("logprobs", [{}, {"logprobs": False}, {"logprobs": None}])
@pytest.mark.parametrize("top", [0, 3, 20])
def test_openai_top_logprobs_needs_logprobs(oclient, path, prompt, logprobs, top) -> None:
    """OpenAI answers ``top_logprobs`` without ``logprobs: true`` with a 400."""
    body = {**prompt, "max_tokens": 1, **logprobs, "top_logprobs": top}
    assert_invalid_request(oclient.post(path, json=body), "top_logprobs", NEEDS_LOGPROBS)


def test_openai_top_logprobs_unset_or_with_logprobs_is_fine(oclient, client) -> None:
    for extra in ({"top_logprobs": None}, {"top_logprobs": -1}, {"logprobs": False}):
        r = oclient.post(CHAT, json={"messages": MESSAGES, "max_tokens": 1, **extra})
        assert r.status_code == 200 and r.json()["choices"][0]["logprobs"] is None
    legacy = {"prompt": "hi", "max_tokens": 1, "logprobs": 0, "top_logprobs": 2}
    top = oclient.post(COMP, json=legacy).json()["choices"][0]["logprobs"]["top_logprobs"]
    assert [len(t) for t in top] == [2]
    # The mlx format keeps mlx-lm's rule: k > 0 alone asks for logprobs.
    r = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 1, "top_logprobs": 2})
    assert len(r.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2


def test_openai_legacy_integer_logprobs_on_completions(sdk: openai.OpenAI, client) -> None:
    fixed = {"model": "any", "prompt": "hello", "max_tokens": 3, "logit_bias": NO_EOS}
    lp = sdk.completions.create(logprobs=3, **fixed).choices[0].logprobs
    assert [len(top) for top in lp.top_logprobs] == [3, 3, 3]
    zero = sdk.completions.create(logprobs=0, **fixed).choices[0].logprobs
    assert zero.tokens == lp.tokens and zero.top_logprobs is None
    # An explicit top_logprobs wins over the legacy integer.
    both = sdk.completions.create(logprobs=3, extra_body={"top_logprobs": 1}, **fixed)
    assert [len(top) for top in both.choices[0].logprobs.top_logprobs] == [1, 1, 1]
    # The mlx format keeps mlx-lm's boolean.
    r = client.post(COMP, json={"prompt": "hi", "logprobs": 2})
    assert_invalid_request(r, "logprobs", "logprobs must be of type bool")


def test_openai_chat_shape_through_the_sdk(sdk: openai.OpenAI) -> None:
    r = sdk.chat.completions.create(
        model="any",
        messages=MESSAGES,
        max_tokens=6,
        temperature=0,
        logit_bias=NO_EOS,
        logprobs=True,
        top_logprobs=20,
    )
    choice = r.choices[0]
    content = choice.logprobs.content
    assert len(content) == r.usage.completion_tokens == 6
    assert choice.logprobs.refusal is None
    for entry in content:
        assert isinstance(entry.token, str) and isinstance(entry.logprob, float)
        assert entry.token == token_text(bytes(entry.bytes))
        tops = entry.top_logprobs
        assert len(tops) == 20
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        # Greedy: the generated token is the most likely one.
        assert (tops[0].token, tops[0].bytes, tops[0].logprob) == (
            entry.token,
            entry.bytes,
            entry.logprob,
        )
    joined = b"".join(bytes(e.bytes) for e in content).decode("utf-8", "replace")
    # mlx-lm's detokenizer drops a leading space of the reply.
    assert choice.message.content == (joined[1:] if joined.startswith(" ") else joined)


def test_openai_chat_only_logprobs_has_empty_top(sdk: openai.OpenAI) -> None:
    r = sdk.chat.completions.create(
        model="any", messages=MESSAGES, max_tokens=2, logprobs=True, logit_bias=NO_EOS
    )
    assert [e.top_logprobs for e in r.choices[0].logprobs.content] == [[], []]


def test_openai_partial_utf8_tokens(sdk: openai.OpenAI) -> None:
    r = sdk.chat.completions.create(
        model="any", messages=MESSAGES, max_tokens=2, logprobs=True, logit_bias={str(C3): 60}
    )
    content = r.choices[0].logprobs.content
    assert [(e.token, e.bytes) for e in content] == [("bytes:\\xc3", [0xC3])] * 2


def test_openai_chat_stream_chunks_carry_the_same_logprobs(sdk: openai.OpenAI) -> None:
    fixed = {"model": "any", "messages": MESSAGES, "max_tokens": 6, "temperature": 0}
    fixed |= {"logit_bias": NO_EOS, "logprobs": True, "top_logprobs": 3}
    whole = sdk.chat.completions.create(**fixed).choices[0]
    chunks = list(sdk.chat.completions.create(stream=True, **fixed))
    streamed = [
        e
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for e in c.choices[0].logprobs.content
    ]
    assert [(e.token, e.bytes) for e in streamed] == [
        (e.token, e.bytes) for e in whole.logprobs.content
    ]
    for a, b in zip(streamed, whole.logprobs.content, strict=True):
        assert math.isclose(a.logprob, b.logprob, abs_tol=1e-4)
        assert [t.token for t in a.top_logprobs] == [t.token for t in b.top_logprobs]
    assert chunks[0].choices[0].logprobs is None  # the role chunk has no tokens
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.message.content


def test_openai_completion_legacy_shape_through_the_sdk(sdk: openai.OpenAI) -> None:
    fixed = {"model": "any", "prompt": "hello", "max_tokens": 5, "temperature": 0}
    fixed |= {"logit_bias": NO_EOS, "logprobs": True, "extra_body": {"top_logprobs": 2}}
    r = sdk.completions.create(**fixed)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 5
    assert lp.text_offset[0] == 0
    assert lp.text_offset == sorted(lp.text_offset)
    assert len(lp.top_logprobs) == 5
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) <= 2 and max(top.values()) == value and token in top
    chunks = list(sdk.completions.create(stream=True, **fixed))
    tokens = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    offsets = [
        o for c in chunks if c.choices[0].logprobs for o in c.choices[0].logprobs.text_offset
    ]
    assert tokens == lp.tokens and offsets == lp.text_offset
    assert "".join(c.choices[0].text for c in chunks) == r.choices[0].text


def test_eos_entry_only_in_the_mlx_block(client: httpx.Client, sdk: openai.OpenAI) -> None:
    stop_now = {str(EOS): 100}  # the first token is EOS
    body = {"prompt": "hi", "max_tokens": 3, "logprobs": True, "logit_bias": stop_now}
    mlx = client.post(COMP, json=body).json()
    assert [e["id"] for e in mlx["choices"][0]["logprobs"]["content"]] == [EOS]
    assert mlx["usage"]["completion_tokens"] == 1
    fixed = {"model": "any", "max_tokens": 3, "logprobs": True, "logit_bias": stop_now}
    chat = sdk.chat.completions.create(messages=MESSAGES, **fixed)
    assert chat.choices[0].finish_reason == "stop" and chat.choices[0].logprobs.content == []
    legacy = sdk.completions.create(prompt="hi", **fixed).choices[0].logprobs
    assert (legacy.tokens, legacy.text_offset) == ([], [])
    chunks = list(sdk.chat.completions.create(messages=MESSAGES, stream=True, **fixed))
    assert all(c.choices[0].logprobs is None for c in chunks if c.choices)


def test_openai_format_not_requested_is_null(oclient: httpx.Client) -> None:
    r = oclient.post(COMP, json={"prompt": "hi", "max_tokens": 2, "stream": True})
    chunks = [json.loads(d) for d in sse_data(r)[:-1]]
    assert all(c["choices"][0]["logprobs"] is None for c in chunks)


HELL = 261  # the tiny model's merged token "hell"
ONLY_HELL = {str(EOS): -1e9, str(HELL): 100}  # the reply is "hellhellhell..."


@pytest.mark.parametrize(
    ("stop", "content", "kept", "generated"),
    [
        ("lh", "hel", 1, 2),  # the first token straddles the stop's start: it is the content's
        ("ellh", "h", 1, 2),
        ("hell", "", 0, 1),  # the stop is the whole first token
        ("hellhellx", "hell" * 6, 6, 6),  # held back, then let out whole: every entry
    ],
)
def test_openai_logprobs_cover_exactly_the_content_before_a_stop(
    sdk: openai.OpenAI, client: httpx.Client, stop: str, content: str, kept: int, generated: int
) -> None:
    """The stop string's tokens are counted but not in OpenAI's logprobs, whole or
    streamed, chat or completions; each stream chunk carries the entries of the
    tokens its text came from. mlx-lm's block keeps one entry per counted token."""
    fixed = {"model": "any", "max_tokens": 6, "temperature": 0, "logit_bias": ONLY_HELL}
    fixed |= {"logprobs": True, "stop": [stop]}
    finish = "length" if generated == 6 and kept == 6 else "stop"
    chat = sdk.chat.completions.create(messages=MESSAGES, **fixed)
    choice = chat.choices[0]
    assert (choice.message.content, choice.finish_reason) == (content, finish)
    assert chat.usage.completion_tokens == generated
    assert [e.token for e in choice.logprobs.content] == ["hell"] * kept
    chunks = list(sdk.chat.completions.create(messages=MESSAGES, stream=True, **fixed))
    pieces = [
        (c.choices[0].delta.content or "", c.choices[0].logprobs.content)
        for c in chunks
        if c.choices and c.choices[0].logprobs
    ]
    assert "".join(text for text, _ in pieces) == content
    assert [e.token for _, entries in pieces for e in entries] == ["hell"] * kept
    for text, entries in pieces:
        assert text and "".join(e.token for e in entries).startswith(text)

    legacy = sdk.completions.create(prompt="hello", **fixed).choices[0]
    assert (legacy.text, legacy.finish_reason) == (content, finish)
    assert legacy.logprobs.tokens == ["hell"] * kept
    assert legacy.logprobs.text_offset == [4 * i for i in range(kept)]
    streamed = list(sdk.completions.create(prompt="hello", stream=True, **fixed))
    lps = [c.choices[0].logprobs for c in streamed if c.choices[0].logprobs]
    assert "".join(c.choices[0].text for c in streamed) == content
    assert [t for lp in lps for t in lp.tokens] == ["hell"] * kept
    assert [o for lp in lps for o in lp.text_offset] == [4 * i for i in range(kept)]

    body = {"prompt": "hello", **{k: v for k, v in fixed.items() if k != "model"}}
    mlx = client.post(COMP, json=body).json()
    assert [e["id"] for e in mlx["choices"][0]["logprobs"]["content"]] == [HELL] * generated

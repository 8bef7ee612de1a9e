"""Prompt building (template + tokenizer) runs off the event loop.

A multi-megabyte prompt takes seconds to template and tokenize; built on the
event loop it stalled every other client. These tests check that the loop
keeps answering while a big prompt is built, and that building prompts on the
prompt threads while the engine thread detokenizes the same tokenizer raises
nothing and changes no output.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine.prompt import normalize_messages, off_loop, render_chat
from mlxspec.engine.text_bound import TextBound

CHAT = "/v1/chat/completions"
#: Keeps the tiny random model from ending early on EOS (``<|im_end|>`` is id 2).
NO_EOS = {"2": -100}
SENTENCE = "the quick brown fox jumps over the lazy dog. "


def big_body(repeats: int, **extra: object) -> dict:
    return {"messages": [{"role": "user", "content": SENTENCE * repeats}], **extra}


def stream_text(c: httpx.Client, body: dict) -> str:
    """The content of a streamed chat completion (checked frame by frame)."""
    pieces, data = [], []
    with c.stream("POST", CHAT, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    for frame in data[:-1]:
        pieces.append(json.loads(frame)["choices"][0]["delta"].get("content") or "")
    assert json.loads(data[-2])["choices"][0]["finish_reason"] == "length"
    return "".join(pieces)


def test_off_loop_returns_the_result_and_raises_the_error() -> None:
    import asyncio

    async def go() -> tuple[str, BaseException | None]:
        name = await off_loop(lambda: threading.current_thread().name)
        try:
            await off_loop(int, "x")
        except ValueError as exc:
            return name, exc
        return name, None

    name, error = asyncio.run(go())
    assert name.startswith("mlxspec-prompt")
    assert str(error) == "invalid literal for int() with base 10: 'x'"


def test_health_answers_while_a_big_prompt_is_built(tiny_server, tiny_engine, monkeypatch) -> None:
    # The character bound would refuse this text before building it (test_text_bound):
    # lifted here, so the build this test is about happens.
    monkeypatch.setattr(tiny_engine, "_text_bound", TextBound(object(), 0))
    body = big_body(25000, max_tokens=1)  # ~1.1 MB of text, ~1M tokens
    outcome: dict[str, object] = {}

    def big() -> None:
        start = time.monotonic()
        with httpx.Client(base_url=tiny_server.base, timeout=120) as c:
            outcome["response"] = c.post(CHAT, json=body)
        outcome["seconds"] = time.monotonic() - start

    with httpx.Client(base_url=tiny_server.base, timeout=60) as c:
        assert c.get("/health").status_code == 200  # connected before the clock starts
        worker = threading.Thread(target=big)
        worker.start()
        time.sleep(0.5)  # the body is sent and the prompt is being built
        # /health, again and again while the build runs: built on the loop, the
        # first call would wait for the whole rest of it (one or two samples)
        waits, codes = [], set()
        while worker.is_alive():
            start = time.monotonic()
            codes.add(c.get("/health").status_code)
            waits.append(time.monotonic() - start)
            time.sleep(0.05)
        worker.join(120)
    response = outcome["response"]
    assert isinstance(response, httpx.Response)
    # The prompt was built whole (its length is in the message), then refused.
    error = response.json()["error"]
    assert (response.status_code, error["code"]) == (400, "context_length_exceeded")
    tokens = len(render_chat(tiny_engine.tokenizer, normalize_messages(body["messages"], "m")))
    assert error["message"] == (
        f"This model's maximum context length is 256 tokens, but the prompt has {tokens} "
        "tokens, leaving no room to generate."
    )
    assert codes == {200}
    # Built on the loop, /health waited for the rest of the build (~3 s of ~4 here);
    # beside it, a typical call takes milliseconds (the median rides out the odd
    # slow one when other processes share this machine's two cores).
    seconds = outcome["seconds"]
    assert isinstance(seconds, float) and seconds > 1.0
    typical = statistics.median(waits)
    assert len(waits) >= 3 and typical < seconds / 8, (
        f"/health answered {len(waits)} times in a {seconds:.2f}s build, median {typical:.2f}s"
    )


def test_big_prompts_built_while_others_stream_raise_nothing(tiny_server) -> None:
    small = [
        {"messages": [{"role": "user", "content": f"story {i}"}], "max_tokens": 16}
        | {"temperature": 0, "logit_bias": NO_EOS}
        for i in range(4)
    ]
    with checking_client(tiny_server.base, timeout=120) as c:
        alone = [stream_text(c, body) for body in small]

    def big(i: int) -> httpx.Response:
        with checking_client(tiny_server.base, timeout=120) as c:
            return c.post(CHAT, json=big_body(6000 + i, max_tokens=1))

    def streamed(body: dict) -> str:
        with checking_client(tiny_server.base, timeout=120) as c:
            return stream_text(c, body)

    with ThreadPoolExecutor(12) as pool:
        bigs = [pool.submit(big, i) for i in range(8)]
        streams = [pool.submit(streamed, body) for body in small]
        counted = [
            pool.submit(
                lambda i=i: httpx.post(
                    f"{tiny_server.base}/v1/messages/count_tokens",
                    json={"model": "m", "messages": [{"role": "user", "content": SENTENCE * i}]},
                )
            )
            for i in range(1, 5)
        ]
        big_results = [f.result() for f in bigs]
        stream_results = [f.result() for f in streams]
        count_results = [f.result() for f in counted]
    assert [(r.status_code, r.json()["error"]["code"]) for r in big_results] == [
        (400, "context_length_exceeded")
    ] * 8
    assert stream_results == alone  # same greedy text as when each ran alone
    assert all(len(text) > 0 for text in alone)
    assert [r.status_code for r in count_results] == [200] * 4
    lengths = [r.json()["input_tokens"] for r in count_results]
    assert lengths == sorted(set(lengths))  # one more sentence, more tokens


def test_encoding_on_threads_while_detokenizing_raises_nothing(tiny_engine) -> None:
    tokenizer = tiny_engine.tokenizer
    texts = [SENTENCE * (2000 + 7 * i) for i in range(6)]
    expected = [list(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    stream = expected[0][:300]
    stop = threading.Event()
    decoded: list[str] = []

    def detokenize() -> None:  # what the engine thread does per generated token
        while not stop.is_set():
            # The engine's own detokenizer, and the naive one that calls the
            # Rust tokenizer's decode for every token.
            for detok in (tokenizer.detokenizer, NaiveStreamingDetokenizer(tokenizer)):
                detok.reset()
                for token in stream:
                    detok.add_token(token)
                detok.finalize()
                decoded.append(detok.text)

    reader = threading.Thread(target=detokenize)
    reader.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda t: tokenizer.encode(t, add_special_tokens=False), texts))
    finally:
        stop.set()
        reader.join(60)
    assert [list(g) for g in got] == expected
    assert decoded and set(decoded) == {tokenizer.decode(stream)}


def test_engine_settles_truncation_and_padding_before_any_request(
    tiny_model_dir, tiny_engine, tmp_path
) -> None:
    """Switching truncation or padding borrows the Rust tokenizer exclusively
    ("Already borrowed" beside a decode on the engine thread); transformers
    switches them off on the first encode, which the engine's constructor makes."""
    import shutil

    from tokenizers import Tokenizer

    from mlxspec.engine import Engine

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_dir, folder)
    raw = Tokenizer.from_file(str(folder / "tokenizer.json"))
    raw.enable_truncation(max_length=8)
    raw.enable_padding(length=8)
    raw.save(str(folder / "tokenizer.json"))
    engine = Engine.load(folder, "tiny-llama", max_batch=1)
    backend = engine.tokenizer._tokenizer._tokenizer  # mlx-lm wrapper -> transformers -> Rust
    assert (backend.truncation, backend.padding) == (None, None)
    text = SENTENCE * 4
    assert engine.text_prompt(text) == tiny_engine.text_prompt(text)  # not cut to 8 tokens

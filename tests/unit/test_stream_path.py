"""The per-token streaming path: engine handle wake-ups, keep-alive pump,
frame templates and the chat chunker (same bytes, less work per token)."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxspec.engine import Delta, Finished, GenerationRequest, RequestHandle
from mlxspec.handlers.chat.chat import _chunker
from mlxspec.handlers.chat.completions import _chunker as _text_chunker
from mlxspec.http import sse

HEAD = {"id": "chatcmpl-1", "created": 7, "model": "m", "system_fingerprint": "fp"}


def _choice(delta: dict, logprobs: Any = None, finish: str | None = None, index: int = 0) -> dict:
    return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_frame_template_matches_data_frame(text: str) -> None:
    template = sse.FrameTemplate({"a": [1, {"b": sse.SLOT}], "c": None})
    assert template.frame(text) == sse.data_frame({"a": [1, {"b": text}], "c": None})


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(JSON_VALUES)
def test_data_frame_is_compact_json_with_line_breaks_escaped(payload: Any) -> None:
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    for raw, escaped in (("\u2028", "\\u2028"), ("\u2029", "\\u2029"), ("\x85", "\\u0085")):
        text = text.replace(raw, escaped)
    assert sse.data_frame(payload) == b"data: " + text.encode() + b"\n\n"


def test_frame_template_escapes_line_breaks_in_the_slot() -> None:
    template = sse.FrameTemplate({"t": sse.SLOT})
    assert template.frame("a\u2028b\n\x85") == b'data: {"t":"a\\u2028b\\n\\u0085"}\n\n'


def test_frame_template_needs_one_slot() -> None:
    with pytest.raises(ValueError, match="exactly once"):
        sse.FrameTemplate({"a": sse.SLOT, "b": sse.SLOT})
    with pytest.raises(ValueError, match="exactly once"):
        sse.FrameTemplate({"a": "x"})


def test_chunker_frames_content_deltas_as_the_dict_would_be() -> None:
    chunk = _chunker(HEAD)
    for index, text in [(0, "hé\n"), (0, ""), (1, "x"), (0, 'q"')]:
        choice = _choice({"content": text}, index=index)
        want = {**HEAD, "object": "chat.completion.chunk", "choices": [choice]}
        assert chunk(choice) == sse.data_frame(want)


@pytest.mark.parametrize(
    "choice",
    [
        _choice({"role": "assistant", "content": ""}),
        _choice({}, finish="stop"),
        _choice({"content": "a"}, logprobs={"content": [], "refusal": None}),
        _choice({"reasoning": "r"}),
    ],
)
def test_chunker_leaves_other_chunks_as_dicts(choice: dict) -> None:
    assert _chunker(HEAD)(choice) == {
        **HEAD,
        "object": "chat.completion.chunk",
        "choices": [choice],
    }


def test_completion_chunker_frames_plain_text_as_the_dict_would_be() -> None:
    head = {"id": "cmpl-1", "object": "text_completion", "created": 7, "model": "m"}
    chunk = _text_chunker(head)
    plain = {"index": 0, "text": " Paris\u2028", "logprobs": None, "finish_reason": None}
    assert chunk(plain) == sse.data_frame({**head, "choices": [plain]})
    scored = {**plain, "logprobs": {"tokens": [" Paris"]}}
    assert chunk(scored) == {**head, "choices": [scored]}
    last = {**plain, "text": "", "finish_reason": "length"}
    assert chunk(last) == {**head, "choices": [last]}


@settings(max_examples=200, deadline=None)
@given(st.text(), st.integers(min_value=0, max_value=3))
def test_chunk_framer_frames_any_text_as_the_chunk_would_be(text: str, index: int) -> None:
    head = {"id": "x", "object": "o"}
    frame = sse.chunk_framer(head, {"t": sse.SLOT, "lp": None})
    for piece in ("warm", text):  # a second text reuses the choice's template
        choice = {"index": index, "t": piece, "lp": None}
        assert frame(choice) == sse.data_frame({**head, "choices": [choice]})
    other = {"index": index, "t": text, "lp": [1]}
    assert frame(other) == {**head, "choices": [other]}
    assert frame({"index": index, "t": text, "lp": None, "extra": 1})["choices"]  # not framed


def test_chunk_framer_needs_the_slot_where_it_may_stand() -> None:
    with pytest.raises(ValueError, match="slot"):
        sse.chunk_framer({}, {"t": "x"})
    with pytest.raises(ValueError, match="slot"):
        sse.chunk_framer({}, {"delta": {"content": sse.SLOT, "role": "assistant"}})


def test_handle_wakes_the_loop_only_for_a_waiting_consumer() -> None:
    """Events emitted while the consumer is busy need no wake-up: it drains
    them in order on its next step; one emitted while it waits wakes it once."""

    async def go() -> tuple[list[Any], int, int]:
        loop = asyncio.get_running_loop()
        wakes = 0
        real = loop.call_soon_threadsafe

        def counting(*args: Any) -> Any:
            nonlocal wakes
            wakes += 1
            return real(*args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        handle = RequestHandle(GenerationRequest((1,), max_tokens=3), loop)
        for text in "ab":
            handle.emit(Delta(text))
        events = handle.__aiter__()
        got = [await events.__anext__(), await events.__anext__()]
        busy_wakes = wakes
        finished = Finished("length", 1, 3)
        later = threading.Timer(0.05, handle.emit, (Delta("c"),))
        later.start()
        got.append(await events.__anext__())  # waits: the engine thread wakes it
        handle.emit(finished)
        got += [event async for event in events]
        later.join()
        return got, busy_wakes, wakes

    got, busy_wakes, wakes = asyncio.run(go())
    assert got == [Delta("a"), Delta("b"), Delta("c"), Finished("length", 1, 3)]
    assert busy_wakes == 0
    assert wakes == 1


def test_handle_delivers_every_event_across_threads_in_order() -> None:
    async def go() -> list[Any]:
        handle = RequestHandle(GenerationRequest((1,), max_tokens=1), asyncio.get_running_loop())

        def engine() -> None:
            for i in range(2000):
                handle.emit(Delta(str(i)))
            handle.emit(Finished("length", 1, 2000))

        thread = threading.Thread(target=engine)
        thread.start()
        events = [event async for event in handle]
        thread.join()
        return events

    events = asyncio.run(go())
    assert [e.text for e in events[:-1]] == [str(i) for i in range(2000)]
    assert events[-1] == Finished("length", 1, 2000)


def test_keepalive_passes_items_then_the_source_error() -> None:
    async def source() -> Any:
        yield 1
        yield 2
        raise RuntimeError("boom")

    async def go() -> list[Any]:
        out: list[Any] = []
        with pytest.raises(RuntimeError, match="boom"):
            async for item in sse.with_keepalive(source(), interval=5):
                out.append(item)
        return out

    assert asyncio.run(go()) == [1, 2]


def test_keepalive_source_cancelled_from_inside_reaches_the_consumer() -> None:
    """A source that raises ``CancelledError`` itself ends the stream with it
    (as awaiting the source directly would) instead of leaving it waiting."""

    async def source() -> Any:
        yield 1
        raise asyncio.CancelledError

    async def go() -> list[Any]:
        out: list[Any] = []
        async for item in sse.with_keepalive(source(), interval=5):
            out.append(item)
        return out

    async def bounded() -> Any:
        return await asyncio.wait_for(go(), 2)

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(bounded())


def test_keepalive_closing_early_stops_the_source() -> None:
    closed = asyncio.Event()

    async def endless() -> Any:
        try:
            while True:
                yield "x"
                await asyncio.sleep(0.01)
        finally:
            closed.set()

    async def go() -> list[Any]:
        stream = sse.with_keepalive(endless(), interval=5)
        got = [await stream.__anext__(), await stream.__anext__()]
        await stream.aclose()
        await asyncio.wait_for(closed.wait(), 2)
        return got

    assert asyncio.run(go()) == ["x", "x"]


def test_keepalive_counts_silence_from_the_last_item() -> None:
    """Items arriving faster than the interval never get a keep-alive between them."""

    async def steady() -> Any:
        for i in range(8):
            await asyncio.sleep(0.03)
            yield i

    async def go() -> list[Any]:
        return [item async for item in sse.with_keepalive(steady(), interval=0.1)]

    assert asyncio.run(go()) == list(range(8))

"""The per-token streaming path: engine handle wake-ups, keep-alive pump,
frame templates and the chat chunker (same bytes, less work per token)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mlxspec import sse
from mlxspec.engine import Delta, Finished, GenerationRequest, LogitsParams, RequestHandle
from mlxspec.engine.handles import coalesced_wakeups, flush_wakeups
from mlxspec.handlers.chat import _chunker
from mlxspec.handlers.completions import _chunker as _text_chunker

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


class CountingLoop(asyncio.SelectorEventLoop):
    """An event loop that records each ``call_soon_threadsafe`` made from
    another thread: ``(callback name, number of waiters it resolves)``."""

    def __init__(self) -> None:
        super().__init__()
        self.wakeups: list[tuple[str, int]] = []

    def call_soon_threadsafe(self, callback: Any, *args: Any, context: Any = None) -> Any:
        if threading.current_thread() is not threading.main_thread():
            waiters = args[0] if args and isinstance(args[0], list) else args
            self.wakeups.append((callback.__name__, len(waiters)))
        return super().call_soon_threadsafe(callback, *args, context=context)


def test_one_engine_step_wakes_the_loop_once_for_every_row() -> None:
    """Three rows waiting on one loop, one step emitting a token to each (then
    a second token to each): one wake-up per step, and each row's consumer
    gets its own tokens in order, none before the step ends."""

    async def go(loop: CountingLoop) -> tuple[list[list[Any]], list[list[Any]]]:
        handles = [RequestHandle(GenerationRequest((1,), max_tokens=2), loop) for _ in range(3)]
        got: list[list[Any]] = [[], [], []]
        seen_inside: list[list[Any]] = []

        async def consume(i: int) -> None:
            async for event in handles[i]:
                got[i].append(event)

        def engine() -> None:
            for step in range(2):
                with coalesced_wakeups():
                    for i, handle in enumerate(handles):
                        handle.emit(Delta(f"{i}.{step}", (10 * i + step,)))
                    time.sleep(0.05)  # a waiter woken now would have run by the end
                    seen_inside.append([list(g) for g in got])
                time.sleep(0.05)
            with coalesced_wakeups():
                for handle in handles:
                    handle.emit(Finished("length", 1, 2))

        consumers = [asyncio.ensure_future(consume(i)) for i in range(3)]
        await asyncio.sleep(0.01)  # every consumer is waiting on an empty buffer
        thread = threading.Thread(target=engine)
        thread.start()
        await asyncio.wait_for(asyncio.gather(*consumers), 10)
        thread.join()
        return got, seen_inside

    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, CountingLoop)
        got, seen_inside = runner.run(go(loop))
    assert got == [
        [Delta(f"{i}.0", (10 * i,)), Delta(f"{i}.1", (10 * i + 1,)), Finished("length", 1, 2)]
        for i in range(3)
    ]
    assert seen_inside == [[[], [], []], [[got[i][0]] for i in range(3)]]
    assert loop.wakeups == [("_wake_all", 3)] * 3


def test_wakeups_outside_a_step_stay_immediate_and_nested_steps_flush_once() -> None:
    async def go(loop: CountingLoop) -> list[Any]:
        handle = RequestHandle(GenerationRequest((1,), max_tokens=2), loop)
        events = handle.__aiter__()

        def emit_nested() -> None:
            with coalesced_wakeups():
                with coalesced_wakeups():
                    handle.emit(Delta("a"))
                handle.emit(Delta("b"))

        first = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.01)
        await asyncio.to_thread(emit_nested)
        got = [await first, await events.__anext__()]
        later = asyncio.ensure_future(events.__anext__())
        await asyncio.sleep(0.01)
        await asyncio.to_thread(handle.emit, Finished("length", 1, 2))
        got.append(await later)
        return got

    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, CountingLoop)
        got = runner.run(go(loop))
    assert got == [Delta("a"), Delta("b"), Finished("length", 1, 2)]
    # to_thread's own completion callbacks are the other entries.
    assert [w for w in loop.wakeups if w[0] in ("_wake", "_wake_all")] == [
        ("_wake_all", 1),
        ("_wake", 1),
    ]


def test_flush_wakeups_delivers_the_rows_served_so_far_before_slow_work() -> None:
    """Inside a step, ``flush_wakeups`` wakes the rows already served (one
    call for both); the rest are woken when the step ends."""

    async def go(loop: CountingLoop) -> tuple[list[list[Any]], list[list[Any]]]:
        handles = [RequestHandle(GenerationRequest((1,), max_tokens=1), loop) for _ in range(3)]
        got: list[list[Any]] = [[], [], []]
        seen_after_flush: list[list[Any]] = []

        async def consume(i: int) -> None:
            async for event in handles[i]:
                got[i].append(event)

        def engine() -> None:
            with coalesced_wakeups():
                handles[0].emit(Delta("a", (1,)))
                handles[1].emit(Delta("b", (2,)))
                flush_wakeups()
                time.sleep(0.05)  # the slow work: the first two are served meanwhile
                seen_after_flush.append([list(g) for g in got])
                handles[2].emit(Delta("c", (3,)))
                flush_wakeups()  # nothing held back twice
                for handle in handles:
                    handle.emit(Finished("length", 1, 1))

        consumers = [asyncio.ensure_future(consume(i)) for i in range(3)]
        await asyncio.sleep(0.01)
        thread = threading.Thread(target=engine)
        thread.start()
        await asyncio.wait_for(asyncio.gather(*consumers), 10)
        thread.join()
        return got, seen_after_flush

    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, CountingLoop)
        got, seen_after_flush = runner.run(go(loop))
    finished = Finished("length", 1, 1)
    assert got == [
        [Delta("a", (1,)), finished],
        [Delta("b", (2,)), finished],
        [Delta("c", (3,)), finished],
    ]
    assert seen_after_flush == [[[Delta("a", (1,))], [Delta("b", (2,))], []]]
    assert loop.wakeups == [("_wake_all", 2), ("_wake_all", 1), ("_wake_all", 2)]


def test_a_batch_of_three_rows_wakes_the_loop_at_most_once_per_step(tiny_engine) -> None:
    """Through the engine: three rows decoding together in the batched lane
    (``shared_prefill`` keeps the first off the lone-request path) wake their
    loop once per step, and a few times more in the steps where they finish,
    where one wake-up per row per step made about three per step."""
    prompt = tuple(tiny_engine.text_prompt("hello"))
    request = GenerationRequest(
        prompt, max_tokens=12, logits=LogitsParams(logit_bias=((2, -1e9),)), shared_prefill=True
    )

    async def go() -> list[list[Any]]:
        async def collect(handle: RequestHandle) -> list[Any]:
            return [event async for event in handle]

        handles = [tiny_engine.submit(request) for _ in range(3)]
        return await asyncio.wait_for(asyncio.gather(*(collect(h) for h in handles)), 60)

    steps_before = tiny_engine.step_times.steps
    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        loop = runner.get_loop()
        assert isinstance(loop, CountingLoop)
        results = runner.run(go())
    steps = tiny_engine.step_times.steps - steps_before
    for events in results:
        assert sum(len(e.token_ids) for e in events if isinstance(e, Delta)) == 12
        assert events[-1].completion_tokens == 12 and events[-1].lane == "batched"
    assert [e for e in results[1] if isinstance(e, Delta)] == [
        e for e in results[0] if isinstance(e, Delta)
    ]
    assert {name for name, _ in loop.wakeups} <= {"_wake_all"}
    # One per batch step, plus one before each finishing row's KV cache is
    # kept and one before the batch drops the rows that ended in a step
    # (flush_wakeups): at most two more per row.
    assert steps >= 12
    assert len(loop.wakeups) <= steps + 2 * 3


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

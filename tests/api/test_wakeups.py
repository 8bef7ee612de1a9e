"""Engine-to-event-loop wake-ups: one per batched decode step for every row
of a loop (:func:`mlxspec.engine.loop.handles.coalesced_wakeups`), not one per row."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from mlxspec.engine import Delta, Finished, GenerationRequest, LogitsParams, RequestHandle
from mlxspec.engine.loop.handles import coalesced_wakeups, flush_wakeups


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

        def until(done: Any) -> None:
            """Wait for the consumers (a busy machine may take longer than any sleep)."""
            deadline = time.monotonic() + 10
            while not done() and time.monotonic() < deadline:
                time.sleep(0.005)

        def all_waiting() -> bool:  # each consumer is parked on its handle's waiter
            return all(h._waiter is not None for h in handles)

        def engine() -> None:
            until(all_waiting)
            with coalesced_wakeups():
                handles[0].emit(Delta("a", (1,)))
                handles[1].emit(Delta("b", (2,)))
                flush_wakeups()
                # the slow work: the first two are served meanwhile
                until(lambda: got[0] and got[1] and all_waiting())
                seen_after_flush.append([list(g) for g in got])
                handles[2].emit(Delta("c", (3,)))
                flush_wakeups()  # nothing held back twice
                until(lambda: got[2] and all_waiting())
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
    # the three Finished events of the step's end: one wake-up for the three rows
    assert loop.wakeups == [("_wake_all", 2), ("_wake_all", 1), ("_wake_all", 3)]


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

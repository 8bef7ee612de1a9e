"""The Whisper service's residency: idle release, holds, resident (no MLX work:
a fake runner runs the jobs inline and the model is a stand-in)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from mlxspec.engine.audio import WhisperCheckpoint, WhisperService


class InlineRunner:
    """Runs exclusive jobs at once on the event loop's thread (plain jobs only)."""

    async def run_exclusive(self, fn: Any) -> Any:
        return fn()


def _service(**kwargs: Any) -> WhisperService:
    checkpoint = WhisperCheckpoint("whisper-test", "mlx", folder=Path("/nonexistent"))
    return WhisperService(checkpoint, InlineRunner(), Path("/tmp"), **kwargs)


def test_idle_release_after_the_last_hold() -> None:
    async def scenario() -> WhisperService:
        service = _service(idle_unload_s=0.05)
        service.model = object()  # as if a take had paged the weights in
        service.hold()
        service.hold()
        service.release()
        await asyncio.sleep(0.1)
        assert service.model is not None  # one hold left: kept
        service.release()
        await asyncio.sleep(0.2)
        return service

    service = asyncio.run(scenario())
    assert service.model is None and service.unloads == 1
    assert service.block()["loaded"] is False and service.block()["idle_unload_sec"] == 0.05


def test_resident_weights_stay_until_unloaded() -> None:
    async def scenario() -> tuple[WhisperService, bool, bool]:
        service = _service(idle_unload_s=0.01, resident=True)
        service.model = object()
        service.hold()
        service.release()
        await asyncio.sleep(0.05)
        kept = service.model is not None
        return service, kept, await service.unload()

    service, kept, unloaded = asyncio.run(scenario())
    assert kept and unloaded and service.model is None
    assert service.block()["resident"] is True and service.block()["idle_unload_sec"] is None


class FakeClock:
    """``time.monotonic`` for the sessions module, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_idle_sessions_expire_and_free_their_slot_and_hold(monkeypatch: Any) -> None:
    """An abandoned session ends ``idle_s`` after its last request (its slot and
    its hold on the weights go; a later call is a 404 saying it expired); a
    request resets the wait, and a session decoding a chunk is never idle. The
    idle checks run by hand on a fake clock; the last one by its real timer."""
    from mlxspec.engine.audio import SessionError, Sessions, TranscribeOptions
    from mlxspec.engine.audio import sessions as sessions_module

    clock = FakeClock()
    monkeypatch.setattr(sessions_module, "time", clock)
    monkeypatch.setattr(sessions_module.time, "perf_counter", lambda: 0.0, raising=False)

    async def scenario() -> dict[str, Any]:
        service = _service(idle_unload_s=60)
        service.model = object()
        sessions = Sessions(service, idle_s=300, max_sessions=2)
        out: dict[str, Any] = {}
        abandoned, _ = await sessions.open(TranscribeOptions(), meta="a")
        kept, _ = await sessions.open(TranscribeOptions(), meta="k")
        try:
            await sessions.open(TranscribeOptions())
        except SessionError as e:
            out["full"] = e.kind
        first, second = sessions._open[abandoned], sessions._open[kept]
        clock.now += 200
        assert sessions.meta(kept) == "k"  # a request: kept's wait starts again
        clock.now += 101
        sessions._reap(first)
        sessions._reap(second)
        out["after_301"] = (sessions.open_count, service.holds)
        for call in (lambda: sessions.meta(abandoned), lambda: sessions.discard(abandoned)):
            try:
                call()
            except SessionError as e:
                out.setdefault("errors", []).append((e.kind, e.message))
        async with second.lock:  # decoding a chunk for longer than idle_s
            clock.now += 1000
            sessions._reap(second)
        out["busy_kept"] = sessions.open_count
        clock.now += 301
        sessions._reap(second)
        out["block"] = sessions.block()
        out["holds"] = service.holds
        out["abandoned"] = abandoned
        return out

    out = asyncio.run(scenario())
    assert out["full"] == "too_many_sessions"
    assert out["after_301"] == (1, 1)
    expired = f"session '{out['abandoned']}' expired after 300 s without a request"
    assert out["errors"] == [("session_not_found", expired)] * 2
    assert out["busy_kept"] == 1
    assert out["block"] == {"open": 0, "expired": 2, "idle_timeout_sec": 300}
    assert out["holds"] == 0


def test_the_idle_timer_runs_by_itself() -> None:
    from mlxspec.engine.audio import Sessions, TranscribeOptions

    async def scenario() -> tuple[int, int]:
        service = _service(idle_unload_s=60)
        service.model = object()
        sessions = Sessions(service, idle_s=0.05)
        await sessions.open(TranscribeOptions())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5  # no request comes: the timer alone expires the session
        while (sessions.open_count or service.holds) and loop.time() < deadline:
            await asyncio.sleep(0.01)
        return sessions.open_count, service.holds

    assert asyncio.run(scenario()) == (0, 0)


def test_deleted_ids_stay_a_409_and_idle_zero_never_expires() -> None:
    from mlxspec.engine.audio import SessionError, Sessions, TranscribeOptions

    async def scenario() -> tuple[Sessions, str]:
        service = _service(idle_unload_s=60)
        service.model = object()
        sessions = Sessions(service, idle_s=0)
        sid, _ = await sessions.open(TranscribeOptions())
        await sessions.open(TranscribeOptions())
        sessions.discard(sid)
        await asyncio.sleep(0.05)
        try:
            sessions.discard(sid)
        except SessionError as e:
            return sessions, f"{e.kind}: {e.message.replace(sid, 'ID')}"
        return sessions, "no error"

    sessions, kind = asyncio.run(scenario())
    assert kind == "session_finished: session 'ID' was deleted"
    assert sessions.block() == {"open": 1, "expired": 0, "idle_timeout_sec": None}


def test_calls_during_a_finish_are_refused_at_once() -> None:
    """While a finish decodes, a chunk, a delete or a second finish is a 409
    "is finishing" at once, not a wait for the finish to end."""
    import numpy as np

    from mlxspec.engine.audio import SessionError, Sessions, TranscribeOptions

    class GatedRunner:
        def __init__(self) -> None:
            self.gate = asyncio.Event()

        async def run_exclusive(self, fn: Any) -> Any:
            await self.gate.wait()
            raise RuntimeError("the decode broke")  # the finish still closes the session

    async def scenario() -> tuple[list[str], str, int]:
        runner = GatedRunner()
        checkpoint = WhisperCheckpoint("whisper-test", "mlx", folder=Path("/nonexistent"))
        service = WhisperService(checkpoint, runner, Path("/tmp"), idle_unload_s=60)
        service.model = object()
        sessions = Sessions(service, idle_s=0)
        sessions.service.load = _no_load  # type: ignore[method-assign]
        sid, _ = await sessions.open(TranscribeOptions())
        finishing = asyncio.ensure_future(sessions.finish(sid))
        await asyncio.sleep(0.01)
        refused = []
        calls = (
            lambda: sessions.feed(sid, np.zeros(1600, np.float32)),
            lambda: sessions.finish(sid),
        )
        for call in calls:
            try:
                await asyncio.wait_for(call(), 1.0)
            except SessionError as e:
                refused.append(e.message.replace(sid, "ID"))
        try:
            sessions.discard(sid)
        except SessionError as e:
            refused.append(e.message.replace(sid, "ID"))
        runner.gate.set()
        try:
            await finishing
        except RuntimeError as e:
            broke = str(e)
        return refused, broke, sessions.open_count

    refused, broke, still_open = asyncio.run(scenario())
    assert refused == ["session 'ID' is finishing"] * 3
    assert broke == "the decode broke" and still_open == 0


async def _no_load() -> float:
    return 0.0

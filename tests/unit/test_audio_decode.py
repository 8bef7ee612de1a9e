"""Audio bytes -> 16 kHz mono: the exact WAV parser and PyAV containers."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from mlxspec.engine.audio.pcm import AudioDecodeError, decode_audio, pcm_float32
from tests.audio_helpers import CONTAINERS, encode


def _wav(data: bytes, *, tag: int, channels: int, rate: int, bits: int, ext: bool = False) -> bytes:
    block = channels * bits // 8
    if ext:  # WAVE_FORMAT_EXTENSIBLE with the sub-format GUID of ``tag``
        guid = struct.pack("<H", tag) + b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
        fmt = struct.pack(
            "<HHIIHHHHI", 0xFFFE, channels, rate, rate * block, block, bits, 22, bits, 0
        )
        fmt += guid
    else:
        fmt = struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
    chunks = b"fmt " + struct.pack("<I", len(fmt)) + fmt
    chunks += b"LIST" + struct.pack("<I", 3) + b"abc\x00"  # an odd chunk: word-aligned skip
    chunks += b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", 4 + len(chunks)) + b"WAVE" + chunks


RAMP = np.linspace(-0.5, 0.5, 1600, dtype=np.float32)


@pytest.mark.parametrize(
    ("tag", "bits", "encoded"),
    [
        (1, 16, (RAMP * 32768).astype("<i2").tobytes()),
        (1, 32, (RAMP * 2**31).astype("<i4").tobytes()),
        (3, 32, RAMP.astype("<f4").tobytes()),
        (3, 64, RAMP.astype("<f8").tobytes()),
        (1, 8, (RAMP * 128 + 128).astype(np.uint8).tobytes()),
    ],
)
@pytest.mark.parametrize("ext", [False, True])
def test_wav_encodings_decode_exactly(tag: int, bits: int, encoded: bytes, ext: bool) -> None:
    out = decode_audio(_wav(encoded, tag=tag, channels=1, rate=16000, bits=bits, ext=ext))
    assert out.dtype == np.float32 and out.shape == RAMP.shape
    assert np.abs(out - RAMP).max() <= (1.0 / 128 if bits == 8 else 1e-4)


def test_wav_24_bit_stereo_is_averaged() -> None:
    left, right = RAMP, -RAMP / 2
    ints = (np.stack([left, right], axis=1).reshape(-1) * 2**23).astype("<i4")
    packed = b"".join(int(v).to_bytes(4, "little", signed=True)[:3] for v in ints)
    out = decode_audio(_wav(packed, tag=1, channels=2, rate=16000, bits=24))
    np.testing.assert_allclose(out, (left + right) / 2, atol=1e-6)


def test_wav_other_rate_is_resampled() -> None:
    tone = np.sin(2 * np.pi * 440 * np.arange(44100) / 44100).astype(np.float32) * 0.5
    out = decode_audio(_wav(tone.astype("<f4").tobytes(), tag=3, channels=1, rate=44100, bits=32))
    assert len(out) == 16000
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(int(np.argmax(spectrum)) - 440) <= 1  # 1 Hz bins over one second


@pytest.mark.parametrize("container", sorted(CONTAINERS))
def test_containers_decode_through_pyav(container: str) -> None:
    rate = 22050
    t = np.arange(rate) / rate
    tone = (0.4 * np.sin(2 * np.pi * 300 * t)).astype(np.float32)
    out = decode_audio(encode(tone, rate, container))
    assert abs(len(out) / 16000 - 1.0) < 0.1
    spectrum = np.abs(np.fft.rfft(out[:16000] if len(out) >= 16000 else out))
    peak = int(np.argmax(spectrum)) * 16000 / (2 * (len(spectrum) - 1))
    assert abs(peak - 300) < 5


@pytest.mark.parametrize(
    "blob", [b"", b"not audio at all", b"RIFF\x00\x00\x00\x00WAVE", b"\x00" * 4096]
)
def test_undecodable_bytes_raise(blob: bytes) -> None:
    with pytest.raises(AudioDecodeError):
        decode_audio(blob)


def test_raw_pcm_float32() -> None:
    out = pcm_float32(RAMP.astype("<f4").tobytes(), 8000)
    assert len(out) == 3200
    with pytest.raises(AudioDecodeError):
        pcm_float32(b"\x00\x00\x00")


@pytest.mark.parametrize("rate", [0, 1, 100, 3999, 768001, 99_999_999_999])
def test_a_sample_rate_out_of_range_is_refused_before_resampling(rate: int) -> None:
    # 1 Hz once asked scipy for a 16000x longer float64 array; 99_999_999_999 Hz
    # (a session chunk's header) for 14.6 TiB: both were a 500.
    with pytest.raises(AudioDecodeError, match=f"a sample rate of {rate} Hz is not supported"):
        pcm_float32(RAMP.astype("<f4").tobytes(), rate)
    if rate < 2**32:  # a WAV header holds 32 bits
        wav = _wav((RAMP * 32768).astype("<i2").tobytes(), tag=1, channels=1, rate=rate, bits=16)
        with pytest.raises(AudioDecodeError, match="not supported|zero sample rate"):
            decode_audio(wav)


@pytest.mark.parametrize("rate", [4000, 768000])
def test_the_rate_bounds_themselves_decode(rate: int) -> None:
    out = pcm_float32(np.zeros(rate // 10, "<f4").tobytes(), rate)  # 0.1 s
    assert len(out) == 1600


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_samples_are_refused(bad: float) -> None:
    x = RAMP.copy()
    x[800] = bad
    with pytest.raises(AudioDecodeError, match="non-finite samples"):
        pcm_float32(x.astype("<f4").tobytes())
    with pytest.raises(AudioDecodeError, match="non-finite samples"):
        decode_audio(_wav(x.astype("<f4").tobytes(), tag=3, channels=1, rate=16000, bits=32))

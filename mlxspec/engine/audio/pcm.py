"""Audio bytes -> 16 kHz mono float32, on every platform, without system tools.

WAV (RIFF/RF64 ``WAVE``) goes through an exact parser of its ``fmt `` and
``data`` chunks: integer PCM of 8/16/24/32 bits, IEEE float of 32/64 bits and
their ``WAVE_FORMAT_EXTENSIBLE`` forms (Microsoft's RIFF and
``mmreg.h`` definitions). Every other container (mp3, m4a/aac, flac, ogg/opus,
webm, mp4/mov audio tracks, aiff, caf) is decoded by PyAV, which carries FFmpeg
inside its wheel; this is where the reference decodes through Apple's
AudioToolbox. Channels are averaged; other rates are resampled to 16 kHz
(FFmpeg's ``swresample`` for PyAV input, a polyphase filter for WAV).

A length cap (``--max-audio-seconds``) is checked before any sample is
converted: a WAV's ``data`` size and a container's declared duration are read
first, and PyAV input is then decoded frame by frame with a running count of
16 kHz samples that stops at the cap, so a few megabytes of compressed silence
declaring (or hiding) hours cost memory proportional to the cap, never to the
file's content.
"""

from __future__ import annotations

import io
import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "SAMPLE_RATE",
    "AudioDecodeError",
    "AudioTooLongError",
    "decode_audio",
    "pcm_float32",
    "resample",
]

#: Whisper's input rate (openai-whisper ``audio.SAMPLE_RATE``).
SAMPLE_RATE = 16000
#: Sample rates accepted as input (Hz). Below 4 kHz resampling would multiply
#: the samples more than 4x before ``--max-audio-seconds`` can refuse them (a
#: 16 MiB WAV declaring 1 Hz asked for terabytes); above 768 kHz (the highest
#: rate audio interfaces offer) the polyphase filter's length explodes instead.
MIN_RATE, MAX_RATE = 4000, 768000
_PCM, _FLOAT, _EXTENSIBLE = 0x0001, 0x0003, 0xFFFE
# WAVE_FORMAT_EXTENSIBLE SubFormat GUIDs end in these 14 bytes (KSDATAFORMAT_SUBTYPE_*).
_GUID_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"
#: A container's declared duration may be an estimate (FFmpeg guesses it from the
#: bitrate for some MP3s): it refuses at once only past the cap by this factor
#: plus one second; nearer the cap the running sample count decides.
_DECLARED_SLACK, _DECLARED_SLACK_S = 1.05, 1.0


class AudioDecodeError(ValueError):
    """The bytes are not audio this server can decode (a 400 on the wire)."""


class AudioTooLongError(AudioDecodeError):
    """The audio is longer than the cap (a 413 ``audio_too_long`` on the wire).

    Args:
        seconds (float): the length known when decoding stopped: the declared
            duration, or the seconds decoded so far (then a lower bound).
        limit (float): the cap, seconds.
        declared (bool): ``seconds`` came from the file's header, before decoding.
    """

    def __init__(self, seconds: float, limit: float, declared: bool) -> None:
        known = f"{seconds:.1f} s long" if declared else f"longer than {seconds:.1f} s"
        super().__init__(f"the audio is {known}; at most {limit:g} s are accepted")
        self.seconds, self.limit, self.declared = seconds, limit, declared


def _cap(seconds: float, limit: float | None, declared: bool) -> None:
    """Raise :class:`AudioTooLongError` when ``seconds`` passes ``limit``."""
    if limit is not None and seconds > limit:
        raise AudioTooLongError(seconds, limit, declared)


@dataclass(frozen=True)
class _Format:
    tag: int
    channels: int
    rate: int
    bits: int


def _parse_fmt(chunk: bytes) -> _Format:
    if len(chunk) < 16:
        raise AudioDecodeError("WAV fmt chunk is too short")
    tag, channels, rate, _, _, bits = struct.unpack("<HHIIHH", chunk[:16])
    if tag == _EXTENSIBLE:
        if len(chunk) < 40 or chunk[26:40] != _GUID_TAIL:
            raise AudioDecodeError("WAV extensible format has an unknown sub-format")
        (tag,) = struct.unpack("<H", chunk[24:26])
    if channels == 0 or rate == 0:
        raise AudioDecodeError("WAV declares no channels or a zero sample rate")
    return _Format(tag, channels, rate, bits)


def _samples(fmt: _Format, data: bytes) -> np.ndarray:
    """Interleaved frames as float32 in [-1, 1], shape ``(frames, channels)``."""
    width = fmt.bits // 8
    frame = width * fmt.channels
    data = data[: len(data) - len(data) % frame] if frame else b""
    if fmt.tag == _FLOAT and fmt.bits in (32, 64):
        x = np.frombuffer(data, dtype="<f4" if fmt.bits == 32 else "<f8").astype(np.float32)
    elif fmt.tag == _PCM and fmt.bits == 8:  # 8-bit WAV is unsigned, centred at 128
        x = (np.frombuffer(data, dtype=np.uint8).astype(np.float32) - 128.0) / 128.0
    elif fmt.tag == _PCM and fmt.bits in (16, 32):
        dt = "<i2" if fmt.bits == 16 else "<i4"
        x = np.frombuffer(data, dtype=dt).astype(np.float32) / float(2 ** (fmt.bits - 1))
    elif fmt.tag == _PCM and fmt.bits == 24:
        raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        ints = raw[:, 0] | (raw[:, 1] << 8) | (raw[:, 2] << 16)
        ints = np.where(ints >= 1 << 23, ints - (1 << 24), ints)
        x = ints.astype(np.float32) / float(1 << 23)
    else:
        raise AudioDecodeError(f"WAV encoding {fmt.tag:#06x} with {fmt.bits} bits is not supported")
    return x.reshape(-1, fmt.channels)


def _parse_wav(blob: bytes) -> tuple[_Format, bytes]:
    """RIFF/RF64 WAVE -> its format and the bytes of its ``data`` chunk."""
    at, fmt, data = 12, None, None
    riff64 = blob[:4] == b"RF64"
    data_size64 = None
    while at + 8 <= len(blob):
        cid, size = blob[at : at + 4], struct.unpack("<I", blob[at + 4 : at + 8])[0]
        body_at = at + 8
        if cid == b"ds64" and riff64 and size >= 16:
            data_size64 = struct.unpack("<Q", blob[body_at + 8 : body_at + 16])[0]
        elif cid == b"fmt ":
            fmt = _parse_fmt(blob[body_at : body_at + size])
        elif cid == b"data":
            if size == 0xFFFFFFFF and data_size64 is not None:
                size = data_size64
            # streaming writers leave size 0 or 0xFFFFFFFF: the data runs to the end
            if size in (0, 0xFFFFFFFF) or body_at + size > len(blob):
                size = len(blob) - body_at
            data = blob[body_at : body_at + size]
            break
        at = body_at + size + (size & 1)  # chunks are word-aligned
    if fmt is None or data is None:
        raise AudioDecodeError("WAV file has no fmt or data chunk")
    return fmt, data


def resample(x: np.ndarray, rate: int, target: int = SAMPLE_RATE) -> np.ndarray:
    """Resample mono float32 audio by a polyphase filter (scipy ``resample_poly``).

    Args:
        x (np.ndarray): samples, shape ``(n,)``.
        rate (int): their rate in Hz.
        target (int): the rate wanted. Default: :data:`SAMPLE_RATE`.

    Returns:
        np.ndarray: float32 samples at ``target`` Hz.

    Raises:
        AudioDecodeError: ``rate`` outside [:data:`MIN_RATE`, :data:`MAX_RATE`].
    """
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioDecodeError(
            f"a sample rate of {rate} Hz is not supported (from {MIN_RATE} to {MAX_RATE} Hz)"
        )
    if rate == target:
        return x.astype(np.float32, copy=False)
    from scipy.signal import resample_poly

    g = math.gcd(rate, target)
    return resample_poly(x, target // g, rate // g).astype(np.float32)


def _declared_seconds(box: Any, stream: Any) -> float | None:
    """The audio stream's duration as its container declares it (seconds), or
    ``None`` when neither the stream nor the container says."""
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if box.duration is not None:  # in AV_TIME_BASE units (microseconds)
        return box.duration / 1_000_000
    return None


def _decode_av(blob: bytes, max_seconds: float | None) -> np.ndarray:
    """Any FFmpeg-readable container's first audio stream, 16 kHz mono float32,
    decoded a frame at a time and stopped once past ``max_seconds``."""
    import av

    limit = 0 if max_seconds is None else int(max_seconds * SAMPLE_RATE)
    try:
        with av.open(io.BytesIO(blob), mode="r", metadata_errors="ignore") as box:
            if not box.streams.audio:
                raise AudioDecodeError("the file has no audio stream")
            stream = box.streams.audio[0]
            declared = _declared_seconds(box, stream)
            if declared is not None and max_seconds is not None:
                if declared > max_seconds * _DECLARED_SLACK + _DECLARED_SLACK_S:
                    raise AudioTooLongError(declared, max_seconds, True)
            resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE)
            pieces: list[np.ndarray] = []
            count = 0
            for frame in box.decode(stream):
                for out in resampler.resample(frame):
                    pieces.append(out.to_ndarray().reshape(-1))
                    count += len(pieces[-1])
                if max_seconds is not None and count > limit:  # the header said less, or nothing
                    raise AudioTooLongError(count / SAMPLE_RATE, max_seconds, False)
            for out in resampler.resample(None):  # flush the resampler's tail
                pieces.append(out.to_ndarray().reshape(-1))
    except AudioDecodeError:
        raise
    except (av.FFmpegError, ValueError, EOFError, OSError) as e:
        raise AudioDecodeError(f"the audio could not be decoded ({type(e).__name__})") from e
    if not pieces:
        raise AudioDecodeError("the audio stream holds no samples")
    return np.concatenate(pieces).astype(np.float32, copy=False)


def _finite(x: np.ndarray) -> np.ndarray:
    # NaN survives np.clip and makes every window's log-mel NaN: Whisper then
    # decodes garbage through the whole fallback ladder (0.25 s of NaN kept
    # tiny.en busy for 52 s on the engine thread), so refuse it here.
    if not np.isfinite(x).all():
        raise AudioDecodeError("the audio holds non-finite samples (NaN or infinity)")
    return x


def decode_audio(blob: bytes, max_seconds: float | None = None) -> np.ndarray:
    """Decode an audio file's bytes to Whisper's input, refusing audio longer
    than ``max_seconds`` before decoding it where the file says how long it is.

    Args:
        blob (bytes): a WAV file or any container FFmpeg reads.
        max_seconds (float | None): the longest audio accepted (seconds): a
            WAV's ``data`` size is checked before conversion, a container's
            declared duration before decoding, and a running count of decoded
            samples stops at the cap (so peak memory follows the cap, not the
            file). Default: ``None`` (no cap).

    Returns:
        np.ndarray: float32 mono samples at 16 kHz, shape ``(n,)``.

    Raises:
        AudioTooLongError: longer than ``max_seconds`` (declared or decoded).
        AudioDecodeError: empty or undecodable bytes, a sample rate outside
            [:data:`MIN_RATE`, :data:`MAX_RATE`], or non-finite samples.
    """
    if not blob:
        raise AudioDecodeError("the audio file is empty")
    if blob[:4] in (b"RIFF", b"RF64") and blob[8:12] == b"WAVE":
        fmt, data = _parse_wav(blob)
        frame = fmt.bits // 8 * fmt.channels
        if frame:  # a WAV's length is exact: its data size over the frame size
            _cap(len(data) // frame / fmt.rate, max_seconds, True)
        frames = _samples(fmt, data)
        mono = frames.mean(axis=1) if frames.shape[1] > 1 else frames[:, 0]
        return resample(np.clip(_finite(mono), -1.0, 1.0), fmt.rate)
    return _finite(_decode_av(blob, max_seconds))


def pcm_float32(
    blob: bytes, rate: int = SAMPLE_RATE, max_seconds: float | None = None
) -> np.ndarray:
    """Raw little-endian float32 mono samples (``audio/pcm;rate=N``), resampled to 16 kHz.

    Args:
        blob (bytes): the samples.
        rate (int): their rate, Hz. Default: :data:`SAMPLE_RATE`.
        max_seconds (float | None): refuse more audio than this before
            resampling it. Default: ``None`` (no cap).

    Raises:
        AudioTooLongError: more than ``max_seconds`` of samples.
        AudioDecodeError: the byte count is not a whole number of samples, the
            rate is outside [:data:`MIN_RATE`, :data:`MAX_RATE`], or a sample
            is not finite.
    """
    if len(blob) % 4:
        raise AudioDecodeError("audio/pcm bodies are float32 samples: a multiple of 4 bytes")
    if rate > 0:
        _cap(len(blob) // 4 / rate, max_seconds, True)
    return resample(_finite(np.frombuffer(blob, dtype="<f4").astype(np.float32)), rate)

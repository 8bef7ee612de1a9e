"""Dictation sessions: ``POST /v1/audio/sessions``, ``/{id}/audio``, ``/{id}/finish``
and ``DELETE /v1/audio/sessions/{id}``."""

from __future__ import annotations

import asyncio
import inspect
import re
import time
from typing import Any

from starlette.responses import Response

from mlxspec.engine import (
    MAX_RATE,
    MIN_RATE,
    AudioTooLongError,
    SessionError,
    WhisperModelError,
    pcm_float32,
)
from mlxspec.errors import ApiError
from mlxspec.handlers.audio.common import (
    current_sessions,
    current_transcriber,
    decoded,
    max_audio_seconds,
    model_error,
    session_error,
    too_long,
)
from mlxspec.handlers.audio.formats import json_body
from mlxspec.handlers.audio.wire import to_options
from mlxspec.handlers.context import request_headers
from mlxspec.handlers.events import until_disconnect

_RATE = re.compile(r";\s*rate\s*=\s*([^;]*)", re.IGNORECASE)


def pcm_rate(media: str) -> int:
    """The ``rate`` parameter of an ``audio/pcm`` content type (Hz; 16000 when
    absent), a whole number.

    Raises:
        ApiError: 400 ``invalid_audio`` for a rate that is not a whole number of Hz
            or lies outside ``MIN_RATE``-``MAX_RATE``.
    """
    found = _RATE.search(media)
    if found is None:
        return 16000
    text = found[1].strip().strip('"')
    # more than 9 digits is out of range anyway (and int() refuses 4300+ digits)
    if not text.isascii() or not text.isdigit() or len(text) > 9:
        raise ApiError(
            "invalid_audio",
            f"the audio/pcm rate {found[1].strip()[:40]!r} is not a whole number of Hz "
            f"from {MIN_RATE} to {MAX_RATE} (e.g. audio/pcm;rate=16000)",
        )
    rate = int(text)
    if not MIN_RATE <= rate <= MAX_RATE:  # before any length is computed from it
        raise ApiError(
            "invalid_audio",
            f"the audio/pcm rate {rate} Hz is outside {MIN_RATE}-{MAX_RATE} Hz "
            "(e.g. audio/pcm;rate=16000)",
        )
    return rate


async def create_session(body: dict[str, Any] | None = None) -> tuple[dict[str, Any], int]:
    """Open a session with the one-shot parameters (the weights load here)."""
    service = current_transcriber()
    fields = dict(body or {})
    options = to_options(fields, task=fields.get("task", "transcribe"),
                         multilingual=service.multilingual)  # fmt: skip
    # the session keeps its response format and when it opened (finish's timings)
    meta = (fields.get("response_format") or "json", time.perf_counter())
    try:
        session_id, _ = await current_sessions().open(options, meta)
    except SessionError as e:
        raise session_error(e) from e
    except WhisperModelError as e:
        raise model_error(e) from e
    usage = service.vocabulary_usage(options.vocabulary, options.prompt)
    vocabulary = None if usage is None else usage.to_json()
    return {"id": session_id, "model": service.model_id, "vocabulary": vocabulary}, 200


async def add_session_audio(session_id: str, body: Any = None) -> dict[str, Any]:
    """Append one chunk: raw ``audio/pcm;rate=N`` float32 mono, or any container."""
    sessions = current_sessions()
    blob = body if isinstance(body, (bytes, bytearray)) else b""
    media = request_headers().get("content-type", "")
    cap = max_audio_seconds()  # one chunk past the take's cap is refused before decoding
    if media.lower().startswith("audio/pcm"):
        rate = pcm_rate(media)
        try:  # resampling a long chunk is work: off the event loop
            samples = await asyncio.to_thread(pcm_float32, bytes(blob), rate, cap)
        except AudioTooLongError as e:
            raise too_long(e, "body") from e
        except ValueError as e:
            raise ApiError("invalid_audio", str(e)) from e
    else:
        samples = await decoded(bytes(blob), param="body", max_seconds=cap)
    try:  # a client that leaves stops the chunk's decoding at the next window (499);
        # its samples stay in the session, decoded by the next chunk or the finish
        receipt = await until_disconnect(sessions.feed(session_id, samples))
    except SessionError as e:
        raise session_error(e) from e
    except WhisperModelError as e:
        raise model_error(e) from e
    return {
        "samples": receipt.samples,
        "duration": round(receipt.duration, 3),
        "speech": receipt.speech,
        "segments": [s.to_json() for s in receipt.segments],
    }


async def finish_session(session_id: str) -> dict[str, Any]:
    """Decode what is left, close the session, answer as the one-shot route."""
    service, sessions = current_transcriber(), current_sessions()
    try:
        fmt, opened = sessions.meta(session_id)
        result = await sessions.finish(session_id)
    except SessionError as e:
        raise session_error(e) from e
    except WhisperModelError as e:
        raise model_error(e) from e
    total_ms = (time.perf_counter() - opened) * 1000
    return json_body(result, service.model_id, total_ms, verbose=fmt == "verbose_json")


async def delete_session(session_id: str) -> Response:
    """Discard a session: 204."""
    try:
        done = current_sessions().discard(session_id)
        if inspect.isawaitable(done):  # the sessions live in the Whisper worker process
            await done
    except SessionError as e:
        raise session_error(e) from e
    return Response(status_code=204)

"""``POST /v1/audio/transcriptions``, ``/v1/audio/translations`` and
``POST /admin/transcription/unload``: convert, transcribe, render."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from mlxspec.engine import (
    JobAbandoned,
    TakeResult,
    TranscribeOptions,
    TranscriberProtocol,
    WhisperModelError,
    WindowDone,
)
from mlxspec.errors import ApiError
from mlxspec.handlers.audio.common import (
    check_length,
    current_transcriber,
    decoded,
    max_audio_seconds,
    model_error,
)
from mlxspec.handlers.audio.formats import json_body, render
from mlxspec.handlers.audio.wire import audio_bytes, to_options
from mlxspec.handlers.events import until_disconnect
from mlxspec.http import sse

log = logging.getLogger("mlxspec.handlers.audio")


async def create_transcription(body: Any = None, file: Any = None, **_: Any) -> Any:
    """Transcribe an upload (``client.audio.transcriptions.create``)."""
    return await _respond(body, file, "transcribe")


async def create_translation(body: Any = None, file: Any = None, **_: Any) -> Any:
    """Translate an upload into English (``client.audio.translations.create``)."""
    return await _respond(body, file, "translate")


async def unload_transcription() -> dict[str, Any]:
    """Page the Whisper weights out now; the service's counters."""
    service = current_transcriber()
    unloaded = await service.unload()
    return {"unloaded": unloaded, **service.block()}


async def _respond(body: Any, file: Any, task: str) -> Any:
    started = time.perf_counter()
    service = current_transcriber()
    fields = dict(body or {})
    upload = await file.read() if file is not None and hasattr(file, "read") else None
    options = to_options(fields, task=task, multilingual=service.multilingual)
    cap = max_audio_seconds()
    audio = await decoded(audio_bytes(fields, upload), max_seconds=cap)
    check_length(len(audio), cap)
    fmt = fields.get("response_format") or "json"
    if fields.get("stream"):
        return sse.event_stream(_stream(service, audio, options, fmt, started))
    try:
        result = await until_disconnect(service.transcribe(audio, options))
    except ApiError as err:
        if err.kind == "cancelled":
            log.info("transcription cancelled: the client left (499)")
        raise
    except JobAbandoned as e:
        raise ApiError("cancelled", "request cancelled") from e
    except WhisperModelError as e:
        raise model_error(e) from e
    return render(result, fmt, service.model_id, (time.perf_counter() - started) * 1000)


def _delta(segment: Any) -> dict[str, Any]:
    where = {"id": segment.id, "start": round(segment.start, 3), "end": round(segment.end, 3)}
    return {"type": "transcript.text.delta", "delta": segment.text, "segment": where}


async def _events(
    service: TranscriberProtocol, audio: Any, options: TranscribeOptions, fmt: str, started: float
) -> AsyncIterator[tuple[str, Any] | bytes]:
    """``transcript.text.delta`` per segment, ``transcript.progress`` per window,
    then ``transcript.text.done`` with the non-streaming body."""
    windows: asyncio.Queue[WindowDone] = asyncio.Queue()
    take = asyncio.ensure_future(service.transcribe(audio, options, emit=windows.put_nowait))
    try:
        while not (take.done() and windows.empty()):
            waiter = asyncio.ensure_future(windows.get())
            await asyncio.wait({waiter, take}, return_when=asyncio.FIRST_COMPLETED)
            if not waiter.done():
                waiter.cancel()
                continue
            done = waiter.result()
            for segment in done.segments:
                yield segment_pair(segment)
            progress = {"type": "transcript.progress", **done.progress.__dict__}
            yield ("transcript.progress", progress)
        try:
            result: TakeResult = take.result()
        except WhisperModelError as e:
            raise model_error(e) from e
        total_ms = (time.perf_counter() - started) * 1000
        body = json_body(result, service.model_id, total_ms, verbose=fmt == "verbose_json")
        yield ("transcript.text.done", {"type": "transcript.text.done", **body})
    finally:
        if not take.done():
            take.cancel()
            log.info("transcription stream cancelled: the client left (499)")


def segment_pair(segment: Any) -> tuple[str, dict[str, Any]]:
    """A segment's ``transcript.text.delta`` event."""
    return ("transcript.text.delta", _delta(segment))


def _stream(
    service: TranscriberProtocol, audio: Any, options: TranscribeOptions, fmt: str, started: float
) -> AsyncIterator[bytes]:
    def on_error(err: ApiError) -> list[tuple[str, Any]]:
        from mlxspec.errors import openai_error_body

        return [("error", {"type": "error", **openai_error_body(err)})]

    events = sse.with_keepalive(_events(service, audio, options, fmt, started))
    return sse.named_events(events, on_error)

"""A finished take in the response formats OpenAI's transcription API names.

``json`` is ``{"text", "mlxspec"}``; ``verbose_json`` adds ``task``,
``language``, ``duration`` and openai-whisper's ``segments`` (and, with word
granularity, ``words`` in each segment as the reference puts them and at the top
level as OpenAI does); ``text``, ``srt`` (SubRip: ``HH:MM:SS,mmm``) and
``vtt`` (WebVTT: ``WEBVTT`` header, ``HH:MM:SS.mmm``) are bare bodies with the
language and timings in ``x-mlxspec-*`` headers.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.responses import JSONResponse, Response

from mlxspec.engine import TakeResult

__all__ = ["MEDIA_TYPES", "json_body", "render", "srt", "vtt"]

#: Response format -> content type (reference: text/plain, application/x-subrip, text/vtt).
MEDIA_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


def _timings(result: TakeResult, total_ms: float) -> dict[str, float]:
    return {
        "load_ms": round(result.load_ms, 3),
        "transcribe_ms": round(result.transcribe_ms, 3),
        "total_ms": round(total_ms, 3),
    }


def json_body(
    result: TakeResult, model: str, total_ms: float, verbose: bool = False
) -> dict[str, Any]:
    """The ``json`` (or ``verbose_json``) body.

    Args:
        result (TakeResult): the take.
        model (str): the Whisper model id.
        total_ms (float): the request's wall time so far.
        verbose (bool): ``verbose_json``. Default: ``False``.
    """
    meta: dict[str, Any] = {
        "model": model,
        "language": result.language,
        "duration": round(result.duration, 3),
        "timings": _timings(result, total_ms),
    }
    if result.vocabulary is not None:
        meta["vocabulary"] = result.vocabulary.to_json()
    if result.vad is not None:
        meta["vad"] = result.vad
    body: dict[str, Any] = {"text": result.text}
    if verbose:
        segments = [s.to_json() for s in result.segments if s.text]
        body.update(
            task=result.task,
            language=result.language,
            duration=round(result.duration, 3),
            segments=segments,
        )
        if any("words" in s for s in segments):
            body["words"] = [w for s in segments for w in s.get("words", [])]
    body["mlxspec"] = meta
    return body


def _clock(seconds: float, sep: str) -> str:
    ms = max(0, round(seconds * 1000))
    hours, ms = divmod(ms, 3_600_000)
    minutes, ms = divmod(ms, 60_000)
    secs, ms = divmod(ms, 1000)
    return f"{hours:02d}:{minutes:02d}:{secs:02d}{sep}{ms:03d}"


def _cues(result: TakeResult) -> list[tuple[float, float, str]]:
    segments = [s for s in result.segments if s.text.strip()]
    return [(s.start, max(s.end, s.start), s.text.strip()) for s in segments]


def srt(result: TakeResult) -> str:
    """SubRip: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, blank-line separated."""
    blocks = [
        f"{i}\n{_clock(a, ',')} --> {_clock(b, ',')}\n{text}\n"
        for i, (a, b, text) in enumerate(_cues(result), start=1)
    ]
    return "\n".join(blocks)


def vtt(result: TakeResult) -> str:
    """WebVTT: the ``WEBVTT`` line, then ``HH:MM:SS.mmm --> HH:MM:SS.mmm`` cues."""
    cues = [f"{_clock(a, '.')} --> {_clock(b, '.')}\n{text}\n" for a, b, text in _cues(result)]
    return "WEBVTT\n\n" + "\n".join(cues)


def render(result: TakeResult, fmt: str, model: str, total_ms: float) -> Any:
    """The HTTP response for ``fmt``: JSON, or a bare body with ``x-mlxspec-*`` headers."""
    if fmt in ("json", "verbose_json"):
        # the operation declares several response types: name the one sent
        return JSONResponse(json_body(result, model, total_ms, verbose=fmt == "verbose_json"))
    text = {"text": lambda r: r.text.strip() + "\n", "srt": srt, "vtt": vtt}[fmt](result)
    headers = {
        "x-mlxspec-language": result.language,
        "x-mlxspec-timings": json.dumps(_timings(result, total_ms), separators=(",", ":")),
    }
    return Response(text, media_type=MEDIA_TYPES[fmt], headers=headers)

"""A transcription request body -> audio bytes and :class:`TranscribeOptions`.

Pure functions over a body the document has validated (types, ranges, enums),
multipart or JSON alike: what remains is what a schema cannot say (the audio
itself, a language name, ``beam_size`` needing temperature 0, the two
spellings of ``timestamp_granularities`` and ``vocabulary``).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from mlxspec.engine import FALLBACK_TEMPERATURES, TranscribeOptions, VadOptions
from mlxspec.errors import ApiError

__all__ = ["audio_bytes", "parse_language", "to_options"]

_DATA_URL = re.compile(r"^data:[^,;]*(?:;[^,;]*)*;base64,", re.IGNORECASE)


def parse_language(value: Any, multilingual: bool = True) -> str | None:
    """An ISO code or language name -> Whisper's code; ``None``/``"auto"`` detects.

    Raises:
        ApiError: ``invalid_request`` for a language Whisper does not know.
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return None
    # Imported here, not at module level: Connexion imports this module to resolve
    # the audio routes, and a text-only install (no mlx-whisper) must still serve text.
    from mlx_whisper.tokenizer import LANGUAGES, TO_LANGUAGE_CODE

    key = str(value).strip().lower()
    code = key if key in LANGUAGES else TO_LANGUAGE_CODE.get(key)
    if code is None:  # a BCP 47 tag such as en-US
        base = key.split("-")[0]
        code = base if base in LANGUAGES else TO_LANGUAGE_CODE.get(base)
    if code is None:
        raise ApiError("invalid_request", f"unknown language '{value}'", param="language")
    if not multilingual and code != "en":
        raise ApiError(
            "invalid_request",
            f"the served Whisper model is English-only; language '{value}' is not available",
            param="language",
        )
    return code


def audio_bytes(body: Mapping[str, Any], upload: bytes | None) -> bytes:
    """The audio of a request: the multipart ``file``, else the JSON ``file``
    (base64 or a ``data:`` URL), ``input_audio.data`` or ``audio``.

    Raises:
        ApiError: ``invalid_request`` when no audio is given or it is not base64.
    """
    if upload is not None:
        return upload
    value = body.get("file")
    if not isinstance(value, str):
        nested = body.get("input_audio")
        value = nested.get("data") if isinstance(nested, Mapping) else body.get("audio")
    if not isinstance(value, str) or not value:
        raise ApiError("invalid_request", "file is required: the audio to transcribe", param="file")
    text = _DATA_URL.sub("", value.strip(), count=1)
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise ApiError("invalid_request", "file is not valid base64 audio", param="file") from e


def _granularities(body: Mapping[str, Any]) -> list[str]:
    value = body.get("timestamp_granularities[]", body.get("timestamp_granularities"))
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _vocabulary(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else value
    return tuple(t.strip() for t in items if isinstance(t, str) and t.strip())


def _temperatures(body: Mapping[str, Any]) -> tuple[float, ...]:
    value = body.get("temperature")
    return FALLBACK_TEMPERATURES if value is None else (float(value),)


def to_options(
    body: Mapping[str, Any], *, task: str, multilingual: bool = True
) -> TranscribeOptions:
    """Convert a validated body into the engine's options.

    Args:
        body (Mapping): the request's fields (multipart form or JSON).
        task (str): ``"transcribe"`` or ``"translate"``.
        multilingual (bool): whether the served model knows other languages.
            Default: ``True``.

    Returns:
        TranscribeOptions: decoding and VAD options.

    Raises:
        ApiError: ``invalid_request`` for an unknown language, ``beam_size``
            with a temperature above 0, or a translation on an English-only model.
    """
    if task == "translate" and not multilingual:
        raise ApiError(
            "invalid_request", "the served Whisper model is English-only: it cannot translate"
        )
    temperatures = _temperatures(body)
    beam_size = body.get("beam_size")
    if beam_size is not None and body.get("temperature") not in (None, 0, 0.0):
        raise ApiError("invalid_request", "beam_size requires temperature 0", param="beam_size")
    if beam_size is not None and int(beam_size) <= 1:
        beam_size = None
    vad = None
    if body.get("vad"):
        vad = VadOptions(
            threshold=float(body.get("vad_threshold", 0.5)),
            min_speech_ms=int(body.get("vad_min_speech_ms", 250)),
            trim=bool(body.get("vad_trim", False)),
        )
    threshold = body.get("no_speech_threshold", 0.6)
    return TranscribeOptions(
        task=task,
        language=parse_language(body.get("language"), multilingual),
        prompt=body.get("prompt") or None,
        vocabulary=_vocabulary(body.get("vocabulary")),
        temperatures=temperatures,
        beam_size=None if beam_size is None else int(beam_size),
        word_timestamps="word" in _granularities(body),
        condition_on_previous_text=bool(body.get("condition_on_previous_text", True)),
        no_speech_threshold=None if threshold is None else float(threshold),
        without_timestamps=bool(body.get("without_timestamps", False)),
        vad=vad,
    )

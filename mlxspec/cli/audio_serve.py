"""How ``mlxspec serve`` sets up speech to text: beside the chat model, or alone."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable
from typing import Any

from mlxspec.config import ServeConfig

logger = logging.getLogger("mlxspec.cli")

#: What a text-only install (benchmarks/h200-wheels.txt) adds for speech to text.
SPEECH_INSTALL = "pip install mlx-whisper av silero-vad scipy"


def whisper_importable() -> bool:
    """Whether ``mlx_whisper`` can be imported, found without importing it (its
    import takes seconds: numba, scipy)."""
    try:
        return importlib.util.find_spec("mlx_whisper") is not None
    except (ImportError, ValueError):  # a broken install, or an import hook that refuses it
        return False


def load_transcription(config: ServeConfig, load_engine: Callable[[ServeConfig], Any]) -> tuple:
    """The chat engine (``None`` for ``serve <whisper checkpoint>``) and the
    Whisper service (``None`` when no checkpoint is configured or installed).

    Without mlx-whisper installed, the default is no Whisper service (the log says
    so and ``/v1/audio/*`` answers 503), so a text-only install serves text; a
    checkpoint named with ``--whisper-model`` or as the model is then an error.

    Raises:
        ModelLoadError: the chat model or the named Whisper checkpoint is unusable,
            or one is named and mlx-whisper is not installed.
    """
    from mlxspec.engine.audio import (
        SoloRunner,
        WhisperModelError,
        WhisperProcess,
        WhisperService,
        resolve_whisper,
        whisper_only,
    )
    from mlxspec.engine.model.loader import ModelLoadError, cache_dir

    try:
        alone = whisper_only(config.model)
        checkpoint = alone if alone is not None else resolve_whisper(config.whisper_model)
    except WhisperModelError as exc:
        raise ModelLoadError(str(exc)) from exc
    if checkpoint is not None and not whisper_importable():
        if alone is not None or config.whisper_model is not None:
            raise ModelLoadError(
                f"speech to text needs mlx-whisper, which is not installed ({SPEECH_INSTALL})"
            )
        logger.warning(
            "speech to text is off: mlx-whisper is not installed (%s); /v1/audio/* answer 503",
            SPEECH_INSTALL,
        )
        checkpoint = None
    engine = None if alone is not None else load_engine(config)
    if checkpoint is None:
        return engine, None
    if engine is None:  # nothing to share the CPU with: a thread of this process
        service: Any = WhisperService(
            checkpoint, SoloRunner(), cache_dir(),
            idle_unload_s=config.whisper_idle_unload, resident=config.whisper_resident,
        )  # fmt: skip
        return engine, service
    # beside a chat model: a child process (by default at the lowest CPU priority), so
    # a take never holds the engine thread (one encoder pass costs seconds on a CPU)
    service = WhisperProcess(
        checkpoint, cache_dir(), idle_unload_s=config.whisper_idle_unload,
        resident=config.whisper_resident, nice=config.whisper_nice,
    )  # fmt: skip
    return engine, service

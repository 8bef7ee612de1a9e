"""How ``mlxspec serve`` sets up speech to text: beside the chat model, or alone."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mlxspec.config import ServeConfig


def load_transcription(config: ServeConfig, load_engine: Callable[[ServeConfig], Any]) -> tuple:
    """The chat engine (``None`` for ``serve <whisper checkpoint>``) and the
    Whisper service (``None`` when no checkpoint is configured or installed).

    Raises:
        ModelLoadError: the chat model or the named Whisper checkpoint is unusable.
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
    engine = None if alone is not None else load_engine(config)
    if checkpoint is None:
        return engine, None
    if engine is None:  # nothing to share the CPU with: a thread of this process
        service: Any = WhisperService(
            checkpoint, SoloRunner(), cache_dir(),
            idle_unload_s=config.whisper_idle_unload, resident=config.whisper_resident,
        )  # fmt: skip
        return engine, service
    # beside a chat model: a child process at the lowest CPU priority, so a take
    # never holds the engine thread (one encoder pass costs seconds on a CPU)
    service = WhisperProcess(
        checkpoint, cache_dir(),
        idle_unload_s=config.whisper_idle_unload, resident=config.whisper_resident,
    )  # fmt: skip
    return engine, service

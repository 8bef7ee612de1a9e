"""The Whisper service's residency: idle release, holds, resident (no MLX work:
a fake runner runs the jobs inline and the model is a stand-in)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from mlxspec.engine.audio import WhisperCheckpoint, WhisperService


class InlineRunner:
    """Runs exclusive jobs at once on the event loop's thread (plain jobs only)."""

    async def run_exclusive(self, fn: Any) -> Any:
        return fn()


def _service(**kwargs: Any) -> WhisperService:
    checkpoint = WhisperCheckpoint("whisper-test", "mlx", folder=Path("/nonexistent"))
    return WhisperService(checkpoint, InlineRunner(), Path("/tmp"), **kwargs)


def test_idle_release_after_the_last_hold() -> None:
    async def scenario() -> WhisperService:
        service = _service(idle_unload_s=0.05)
        service.model = object()  # as if a take had paged the weights in
        service.hold()
        service.hold()
        service.release()
        await asyncio.sleep(0.1)
        assert service.model is not None  # one hold left: kept
        service.release()
        await asyncio.sleep(0.2)
        return service

    service = asyncio.run(scenario())
    assert service.model is None and service.unloads == 1
    assert service.block()["loaded"] is False and service.block()["idle_unload_sec"] == 0.05


def test_resident_weights_stay_until_unloaded() -> None:
    async def scenario() -> tuple[WhisperService, bool, bool]:
        service = _service(idle_unload_s=0.01, resident=True)
        service.model = object()
        service.hold()
        service.release()
        await asyncio.sleep(0.05)
        kept = service.model is not None
        return service, kept, await service.unload()

    service, kept, unloaded = asyncio.run(scenario())
    assert kept and unloaded and service.model is None
    assert service.block()["resident"] is True and service.block()["idle_unload_sec"] is None

"""Prompts a socket receives while a turn runs (reference, ``queue_update``).

``steering`` prompts join the running turn before its next model step (a turn
that calls coding tools takes several); ``followUp`` prompts start a turn after
it. Steering left when a turn ends goes first. At most :data:`MAX_QUEUED`.
"""

from __future__ import annotations

from typing import Any

from mlxspec.errors import ApiError

__all__ = ["MAX_QUEUED", "PromptQueue"]

#: Messages one socket may hold queued.
MAX_QUEUED = 16
KINDS = ("steering", "followUp")


class PromptQueue:
    """The queued prompts of one socket, in the order they will be sent."""

    def __init__(self) -> None:
        self.items: dict[str, list[str]] = {kind: [] for kind in KINDS}

    def __bool__(self) -> bool:
        return any(self.items.values())

    def frame(self) -> dict[str, Any]:
        """The ``queue_update`` frame."""
        return {"type": "queue_update", **{k: list(v) for k, v in self.items.items()}}

    def add(self, text: str, kind: str | None) -> None:
        """Queue ``text`` as ``kind`` (default ``followUp``).

        Raises:
            ApiError: :data:`MAX_QUEUED` prompts are queued already.
        """
        if sum(map(len, self.items.values())) >= MAX_QUEUED:
            raise ApiError("invalid_request", f"{MAX_QUEUED} messages are queued already")
        self.items[kind or "followUp"].append(text)

    def clear(self) -> None:
        """Drop every queued prompt."""
        self.items = {kind: [] for kind in KINDS}

    def take_steering(self) -> list[str]:
        """The steering prompts, taken off the queue."""
        taken, self.items["steering"] = self.items["steering"], []
        return taken

    def pop_next(self) -> str | None:
        """The prompt to start the next turn with (steering first), or ``None``."""
        for kind in KINDS:
            if self.items[kind]:
                return self.items[kind].pop(0)
        return None

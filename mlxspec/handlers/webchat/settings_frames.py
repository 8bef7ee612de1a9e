"""The ``/ws/chat`` frames that change a session's settings (``set_*``), as a
mixin of :class:`~.socket.ChatSocket`: each is kept in the socket's settings
and, once the chat is stored, in the session's row."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from mlxspec.engine import EngineRequestError
from mlxspec.errors import ApiError
from mlxspec.handlers.adapters.select import request_adapters
from mlxspec.handlers.webchat.sessions import SessionSettings
from mlxspec.handlers.webchat.turn import SAMPLING_FIELDS, as_api_error

if TYPE_CHECKING:
    from mlxspec.handlers.webchat.agent import AgentTurn
    from mlxspec.handlers.webchat.hub import ChatHub

__all__ = ["SettingsFrames"]


class SettingsFrames:
    """``set_system_prompt``, ``set_thinking``, ``set_tools``, ``set_adapter``,
    ``set_sampling`` and ``set_coding_tools``."""

    hub: ChatHub
    settings: SessionSettings
    next_turn: dict[str, Any]
    turn: AgentTurn | None
    coding_pending: bool | None

    async def send(self, frame: dict[str, Any]) -> None:  # pragma: no cover - the socket's
        raise NotImplementedError

    async def _save(self, settings: SessionSettings) -> None:  # pragma: no cover
        raise NotImplementedError

    async def _on_set_coding_tools(self, frame: dict[str, Any]) -> None:
        enabled = frame["enabled"]
        if enabled and not self.hub.has_tools:
            raise ApiError(
                "invalid_request",
                "coding tools are off on this server: start it with --web-tools WORKSPACE_DIR",
                param="enabled",
            )
        if self.turn is not None:  # the running turn keeps its tools
            self.coding_pending = enabled
        else:
            await self._save(dataclasses.replace(self.settings, coding_tools=enabled))
        await self.send_coding_tools()

    async def send_coding_tools(self) -> None:
        """Send whether the coding tools are on, and a change waiting for the turn."""
        active = self.settings.coding_tools
        await self.send({"type": "coding_tools", "active": active, "pending": self.coding_pending})

    async def _on_set_system_prompt(self, frame: dict[str, Any]) -> None:
        text = frame["text"] or None
        await self._save(dataclasses.replace(self.settings, system_prompt=text))

    async def _on_set_thinking(self, frame: dict[str, Any]) -> None:
        await self._save(dataclasses.replace(self.settings, thinking=frame["enabled"]))

    async def _on_set_tools(self, frame: dict[str, Any]) -> None:
        tools = tuple(frame["tools"] or ())
        await self._save(dataclasses.replace(self.settings, tools=tools))

    async def _on_set_adapter(self, frame: dict[str, Any]) -> None:
        spec = frame["id"] if "id" in frame else frame["adapter"]  # adapter: the old name
        if spec is not None:
            try:  # checked now, as a chat body's would be: an unknown id is named at once
                request_adapters(self.hub.engine, {"adapter": spec})
            except EngineRequestError as exc:
                raise as_api_error(exc) from exc
        await self._save(dataclasses.replace(self.settings, adapter=spec))

    async def _on_set_sampling(self, frame: dict[str, Any]) -> None:
        fields = {k: frame[k] for k in SAMPLING_FIELDS if k in frame}
        if frame.get("scope") == "next_turn":
            self.next_turn.update({k: v for k, v in fields.items() if v is not None})
            return
        sampling = {**self.settings.sampling, **fields}
        sampling = {k: v for k, v in sampling.items() if v is not None}  # null: the default
        await self._save(dataclasses.replace(self.settings, sampling=sampling))

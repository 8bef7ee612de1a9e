"""The ``/ws/chat`` protocol: one connection's frames, sessions and turns.

:class:`ChatSocket` reads client frames (:mod:`.frames`) and answers them
(reference, "Web chat WebSocket (``/ws/chat``)"). Its state is the session it
shows: ``None`` for a blank chat, which becomes a stored session at its first
``prompt``, with the settings chosen meanwhile. A turn changes the store only
once the engine took it: a refused one (``context_length_exceeded``, a full
queue) is an ``error`` frame and a ``turn_end``, and leaves no session, message
or truncation behind (a refused first prompt creates no conversation). A turn runs as a task beside
the frame loop, so ``abort`` (or the socket closing) reaches it while it
streams; frames that leave the session (``new_session``, ``open_session``, ...)
stop a running turn first, keeping what it wrote. Sessions are shared through
:class:`ChatHub`: another socket's list follows each change, and a socket
showing a session another one just answered reloads its history.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from mlxspec.errors import ApiError
from mlxspec.handlers.turns.turns import count_prompt
from mlxspec.handlers.webchat.agent import AgentTurn
from mlxspec.handlers.webchat.frames import FrameError, dump_frame, error_frame, read_frame
from mlxspec.handlers.webchat.hub import ChatHub
from mlxspec.handlers.webchat.queue import PromptQueue
from mlxspec.handlers.webchat.sessions import (
    ChatMessage,
    Session,
    SessionSettings,
    new_session_id,
    sibling_view,
)
from mlxspec.handlers.webchat.settings_frames import SettingsFrames
from mlxspec.handlers.webchat.tools.app_context import AppContext
from mlxspec.handlers.webchat.turn import as_api_error, chat_body

__all__ = ["ChatSocket"]

log = logging.getLogger("mlxspec.webchat")

#: Frames that show another session: a running turn is stopped first.
_LEAVING = frozenset({"new_session", "open_session", "fork_session", "delete_session"})
#: Frames that start a turn or change the branch: refused while one runs (a
#: ``prompt`` then is queued instead).
_TURNS = frozenset({"regenerate", "edit_resend", "switch_sibling"})


class ChatSocket(SettingsFrames):
    """One ``/ws/chat`` connection after its handshake (and key check).

    Args:
        hub (ChatHub): the app's shared state.
        send_text (Callable): sends a text message; raises once the socket is closed.
    """

    def __init__(self, hub: ChatHub, send_text: Any) -> None:
        self.hub = hub
        self._send_text = send_text
        self._lock = asyncio.Lock()
        self.closed = False
        self.session_id: str | None = None
        self.settings = SessionSettings()
        self.next_turn: dict[str, Any] = {}
        self.turn: AgentTurn | None = None
        #: ``set_coding_tools`` sent while a turn ran: applied when it ends.
        self.coding_pending: bool | None = None
        #: Prompts sent while a turn ran (:mod:`.queue`).
        self.queue = PromptQueue()
        #: What the page last said it shows (``context`` frames; the app tools).
        self.app = AppContext(self.send)
        self.task: asyncio.Task[None] | None = None

    async def send(self, frame: dict[str, Any]) -> None:
        """Send one frame; after the client left, nothing (and the turn stops)."""
        if self.closed:
            return
        async with self._lock:
            try:
                await self._send_text(dump_frame(frame))
            except Exception:  # the socket closed under us (any ASGI server's way)
                self.closed = True
        if self.closed and self.turn is not None:
            self.turn.abort()

    async def open(self) -> None:
        """Greet a new connection: ``ready``, ``sessions``, an empty ``history``."""
        self.hub.sockets.add(self)
        engine = self.hub.engine
        defaults = engine.defaults
        await self.send(
            {
                "type": "ready",
                "model": engine.info.id,
                "vision": "vision" in engine.info.media,
                "audio": "audio" in engine.info.media,
                "thinking": self.hub.thinking,
                "genDefaults": {
                    "temperature": defaults.temperature,
                    "top_p": defaults.top_p,
                    "top_k": defaults.top_k,
                    "max_tokens": defaults.max_tokens,
                },
                "transcription": self.hub.transcription,
                "contextWindow": self.hub.context_window,
                "defaultAdapter": _default_adapter(engine),
                "codingTools": self.hub.has_tools,
            }
        )
        await self.send_sessions()
        await self.send_history()

    async def close(self) -> None:
        """The client left: stop the running turn (its slot is freed at the next
        decode step) and wait until its partial answer is stored."""
        self.closed = True
        self.hub.sockets.discard(self)
        await self.stop_turn()

    async def stop_turn(self) -> None:
        """Abort the running turn, if any, and wait for it to end."""
        if self.turn is not None:
            self.turn.abort()
        if self.task is not None:
            with contextlib.suppress(Exception):
                await self.task

    async def receive(self, message: Mapping[str, Any]) -> None:
        """Answer one client message (an ASGI ``websocket.receive``); a bad
        frame or a refused one is an ``error`` frame, never a closed socket."""
        try:
            frame = read_frame(message)
            await self.dispatch(frame)
        except FrameError as exc:
            await self.send(error_frame(exc.error))
        except ApiError as exc:
            await self.send(error_frame(exc))

    async def dispatch(self, frame: dict[str, Any]) -> None:
        """Run one valid frame (``auth`` after the handshake is a no-op)."""
        kind = frame["type"]
        running = self.turn is not None  # until its answer is stored and turn_end sent
        if kind in _TURNS and running:
            raise ApiError("invalid_request", "a turn is running: abort it first")
        if kind == "prompt" and running:
            await self._enqueue(frame)
            return
        if kind in _LEAVING:
            await self._clear_queue()
            if running:
                await self.stop_turn()
        handler = getattr(self, f"_on_{kind}", None)
        if handler is not None:
            await handler(frame)

    # ---------------------------------------------------------------- frames

    async def _on_abort(self, frame: dict[str, Any]) -> None:
        await self._clear_queue()  # stop means stop: nothing queued starts after it
        if self.turn is not None:
            self.turn.abort()

    async def _enqueue(self, frame: dict[str, Any]) -> None:
        if frame.get("images"):
            self._check_images(frame)
            raise ApiError(
                "invalid_request",
                "a prompt with images is not queued: send it once the running turn ends",
                param="images",
            )
        self.queue.add(frame["text"], frame.get("queue"))
        await self.send(self.queue.frame())

    async def _clear_queue(self) -> None:
        if self.queue:
            self.queue.clear()
            await self.send(self.queue.frame())

    async def take_steering(self) -> list[str]:
        """The steering prompts, taken off the queue (the running turn's next step)."""
        taken = self.queue.take_steering()
        if taken:
            await self.send(self.queue.frame())
        return taken

    async def _next_queued(self) -> None:
        """After a turn: start the next queued prompt, if any."""
        if self.closed or self.turn is not None or (text := self.queue.pop_next()) is None:
            return
        await self.send(self.queue.frame())
        try:
            await self._on_prompt({"type": "prompt", "text": text})
        except ApiError as exc:
            await self.send(error_frame(exc))

    async def _on_context(self, frame: dict[str, Any]) -> None:
        self.app.update(frame["context"])

    async def _on_approval(self, frame: dict[str, Any]) -> None:
        if self.turn is None or not self.turn.approve(frame):
            raise ApiError(
                "invalid_request", f"no tool call {frame['callId']!r} awaits approval", "callId"
            )

    async def _on_list_sessions(self, frame: dict[str, Any]) -> None:
        await self.send_sessions()

    async def _on_new_session(self, frame: dict[str, Any]) -> None:
        self.session_id, self.settings, self.next_turn = None, SessionSettings(), {}
        await self.send_history()
        await self.send_sessions()

    async def _on_open_session(self, frame: dict[str, Any]) -> None:
        sid = _target(frame)
        session = await self._session(sid)
        self.session_id, self.settings, self.next_turn = sid, session.settings, {}
        await self.send_history(session)
        await self.send_sessions()

    async def _on_fork_session(self, frame: dict[str, Any]) -> None:
        new = await self.hub.call("fork", _target(frame))
        if new is None:
            raise _unknown(_target(frame))
        await self._on_open_session({"path": new})
        await self.hub.changed(self)

    async def _on_delete_session(self, frame: dict[str, Any]) -> None:
        sid = _target(frame)
        if not await self.hub.call("delete", sid):
            raise _unknown(sid)
        if self.session_id == sid:
            self.session_id, self.next_turn = None, {}
            await self.send_history()
        await self.send_sessions()
        await self.hub.changed(self)

    async def _on_switch_sibling(self, frame: dict[str, Any]) -> None:
        session = await self._current()
        entry = frame["entryId"]
        if not await self.hub.call("switch", session.summary.id, entry):
            raise ApiError("not_found", f"no message {entry!r} in this chat", param="entryId")
        shown = await self._session(session.summary.id)
        await self.send_history(shown)
        mine = next((m for m in shown.messages if m.entry == entry), None)
        if mine is not None:
            view = sibling_view(entry, mine.siblings)
            await self.send({"type": "siblings", "entryId": entry, **view})
        await self.hub.changed(self, session.summary.id)

    def _check_images(self, frame: dict[str, Any]) -> None:
        """Refuse ``prompt.images`` on a model that takes none (``ready.vision`` false)."""
        info = self.hub.engine.info
        if frame.get("images") and "vision" not in info.media:
            raise ApiError("invalid_request", f"model {info.id} takes no images", param="images")

    async def _on_prompt(self, frame: dict[str, Any]) -> None:
        self._check_images(frame)
        images = [{"data": i["data"], "mimeType": i["mimeType"]} for i in frame.get("images", ())]
        # the images are kept with the message (meta.images), sent as image parts each turn
        user = ChatMessage("user", frame["text"], meta={"images": images} if images else {})
        if self.session_id is None:
            sid = new_session_id()

            async def commit() -> None:  # the settings chosen until the engine took the turn
                await self.hub.call("create", self.settings, "New chat", sid)
                await self.hub.call("append", sid, user)

            await self._start(sid, (user,), commit)
            return
        session = await self._session(self.session_id)
        sid = session.summary.id
        await self._start(
            sid, (*session.messages, user), lambda: self.hub.call("append", sid, user)
        )

    async def _on_regenerate(self, frame: dict[str, Any]) -> None:
        session = await self._current()
        last, sid = _last_user(session), session.summary.id
        messages = session.messages[: last + 1]
        await self._start(sid, messages, lambda: self.hub.call("truncate", sid, last + 1))

    async def _on_edit_resend(self, frame: dict[str, Any]) -> None:
        session = await self._current()
        last, sid = _last_user(session), session.summary.id
        kept = session.messages[last].meta.get("images")  # an edit keeps the message's images
        user = ChatMessage("user", frame["text"], meta={"images": kept} if kept else {})
        messages = (*session.messages[:last], user)
        await self._start(sid, messages, lambda: self.hub.call("append", sid, user, last))

    # --------------------------------------------------------------- helpers

    async def _start(
        self, sid: str, messages: Sequence[ChatMessage], commit: Callable[[], Awaitable[Any]]
    ) -> None:
        """Start a turn answering ``messages`` of session ``sid`` as a task;
        ``commit`` stores them once the engine took it (:meth:`_opened`)."""
        hub = self.hub

        async def opened() -> None:
            await self._opened(sid, commit)

        async def store(message: ChatMessage, keep: int) -> None:
            await hub.call("append", sid, message, keep)

        runner = hub.tool_runner(self.app) if self.settings.coding_tools else None
        steps = hub.config.web_tool_steps if hub.config is not None else 1
        self.turn = AgentTurn(
            hub.engine, sid, self.settings, messages, self.next_turn, self.send,
            opened, store, runner, hub.approvals, steps, self.take_steering,
        )  # fmt: skip
        self.next_turn = {}
        self.task = asyncio.ensure_future(self._run(self.turn, sid))

    async def _opened(self, sid: str, commit: Callable[[], Awaitable[Any]]) -> None:
        """The engine took the turn: store its messages, show them (the history
        the turn answers; its ``context`` follows the answer) and the list."""
        await commit()
        self.session_id = sid
        await self.send_history(context=False)
        await self.send_sessions()
        await self.hub.changed(self)

    async def _run(self, turn: AgentTurn, session_id: str) -> None:
        ended = False  # turn_end sent: a later failure must not send a second one
        try:
            end = await turn.run()
            self.turn = None  # stored: the next turn may start once turn_end is seen
            ended = True
            await self.send(end)
            if not turn.stored:  # refused: an error frame said why, nothing was stored
                return
            tokens = turn.context_tokens
            if tokens is None:
                tokens = await self._count(await self._session(session_id))
            await self.send_context(tokens)
            await self.send_sessions()
            await self.hub.changed(self, session_id)
        except Exception:
            log.exception("web chat turn failed")
            await self.send(error_frame(ApiError.internal()))
            if not ended:
                await self.send({"type": "turn_end", "finishReason": "error"})
        finally:
            if self.turn is turn:
                self.turn = None
            if self.coding_pending is not None:
                enabled, self.coding_pending = self.coding_pending, None
                await self._save(dataclasses.replace(self.settings, coding_tools=enabled))
                await self.send_coding_tools()
            await self._next_queued()

    async def _save(self, settings: SessionSettings) -> None:
        self.settings = settings
        if self.session_id is not None:
            await self.hub.call("set_settings", self.session_id, settings)

    async def _session(self, session_id: str) -> Session:
        session = await self.hub.call("get", session_id)
        if session is None:
            raise _unknown(session_id)
        return session

    async def _current(self) -> Session:
        if self.session_id is None:
            raise ApiError("invalid_request", "this chat has no messages yet")
        return await self._session(self.session_id)

    async def _count(self, session: Session | None) -> int:
        """Tokens the conversation takes as the next prompt (0 for a blank chat)."""
        if session is None or not session.messages:
            return 0
        body = chat_body(session.summary.id, session.settings, session.messages)
        try:
            return await count_prompt(self.hub.engine, body)
        except Exception as exc:  # a template that cannot render: say so, count nothing
            await self.send(error_frame(as_api_error(exc)))
            return 0

    async def send_sessions(self) -> None:
        """Send the conversation list (``sessions``)."""
        items = [s.wire() for s in await self.hub.call("list")]
        active = self.session_id
        await self.send(
            {"type": "sessions", "items": items, "activePath": active, "activeId": active}
        )

    async def send_history(self, session: Session | None = None, context: bool = True) -> None:
        """Send the shown session's messages and settings (``history``), then
        (with ``context``) its ``context``."""
        if session is None and self.session_id is not None:
            session = await self.hub.call("get", self.session_id)
            if session is None:  # deleted by another socket
                self.session_id = None
        if session is not None:
            self.settings = session.settings
        items = [m.wire() for m in session.messages] if session is not None else []
        await self.send(
            {
                "type": "history",
                "sessionId": self.session_id,
                "settings": self.settings.wire(),
                "items": items,
            }
        )
        if context:
            await self.send_context(await self._count(session))

    async def send_context(self, tokens: int) -> None:
        """Send the context use (``context``)."""
        window = self.hub.context_window
        percent = round(100 * tokens / window, 1)
        await self.send(
            {"type": "context", "tokens": tokens, "contextWindow": window, "percent": percent}
        )


def _default_adapter(engine: Any) -> str | None:
    """The adapter a turn that names none runs with (``--adapter-path``, while mounted)."""
    default = engine.adapters.default
    return default if default is not None and default in engine.adapters.ids() else None


def _target(frame: dict[str, Any]) -> str:
    """The session a frame names: ``path`` (the reference's field), else ``id``."""
    return str(frame["path"] if "path" in frame else frame["id"])


def _unknown(session_id: str) -> ApiError:
    return ApiError("not_found", f"no chat session {session_id!r}", param="path")


def _last_user(session: Session) -> int:
    """The index of the session's last user message."""
    for i in range(len(session.messages) - 1, -1, -1):
        if session.messages[i].role == "user":
            return i
    raise ApiError("invalid_request", "this chat has no user message to answer")

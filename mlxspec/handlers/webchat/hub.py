"""What the ``/ws/chat`` sockets of one app share: the engine, the sessions
store, the coding tools' workspace and always-allow list, and each other."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from mlxspec.handlers.webchat.sessions import ChatStore
from mlxspec.handlers.webchat.tools.app_context import AppContext
from mlxspec.handlers.webchat.tools.approvals import ApprovalList
from mlxspec.handlers.webchat.tools.catalog import ToolRunner
from mlxspec.handlers.webchat.tools.mcp_servers import McpServers
from mlxspec.handlers.webchat.tools.workspace import Workspace
from mlxspec.parsers import detect

if TYPE_CHECKING:
    from mlxspec.handlers.webchat.socket import ChatSocket

__all__ = ["ChatHub"]


class ChatHub:
    """What the sockets of one app share: the engine, the store, each other.

    Args:
        engine (Engine): the serving engine.
        store (ChatStore): the sessions database.
        context_window (int): tokens one turn may take (the operator's cap,
            else the model's window).
        transcription (bool): a Whisper service answers ``/v1/audio/sessions``
            (the page shows its microphone). Default: ``False``.
        config (ServeConfig | None): the coding tools' workspace and caps
            (``web_tools``, ``web_tool_steps``, ``web_tool_timeout``,
            ``web_tool_output``). Default: ``None`` (no coding tools).
        approvals (ApprovalList | None): the always-allow list. Default:
            ``None`` (the file in mlxspec's config folder).
    """

    def __init__(
        self,
        engine: Any,
        store: ChatStore,
        context_window: int,
        transcription: bool = False,
        config: Any = None,
        approvals: ApprovalList | None = None,
    ) -> None:
        self.engine, self.store, self.context_window = engine, store, context_window
        self.transcription = transcription
        root = getattr(config, "web_tools", None)
        self.workspace = Workspace(root) if root else None
        mcp_file = getattr(config, "mcp_config", None)
        self.mcp = McpServers(mcp_file) if mcp_file else None
        self.config = config
        self.approvals = approvals or ApprovalList()
        self.sockets: set[ChatSocket] = set()
        self.thinking = detect(engine.chat_format).reasoning is not None

    def tool_runner(self, app: AppContext | None = None) -> ToolRunner | None:
        """A runner for one turn's tool calls; ``None`` without ``--web-tools``
        and ``--mcp-config``. ``app``: the socket's page context (the app tools)."""
        if not self.has_tools:
            return None
        config = self.config
        # a result longer than the context window in bytes (about a quarter of it in
        # tokens, for text) would leave the conversation unable to continue
        limit = min(config.web_tool_output, max(1024, self.context_window))
        return ToolRunner(self.workspace, config.web_tool_timeout, limit, self.mcp, app)

    @property
    def has_tools(self) -> bool:
        """The server runs tools for the chat (``--web-tools`` or ``--mcp-config``)."""
        return self.workspace is not None or self.mcp is not None

    async def call(self, method: str, *args: Any) -> Any:
        """``store.<method>(*args)`` off the event loop (a commit fsyncs)."""
        return await asyncio.to_thread(getattr(self.store, method), *args)

    async def changed(self, origin: ChatSocket, session_id: str | None = None) -> None:
        """Tell the other sockets the list changed; those showing ``session_id``
        get its history again."""
        for socket in list(self.sockets - {origin}):
            await socket.send_sessions()
            if session_id is not None and socket.session_id == session_id:
                await socket.send_history()

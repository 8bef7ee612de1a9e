"""The coding tools the model is offered, and the one place a call is run.

``read``, ``ls`` and ``grep`` only read, and run without asking; ``bash``,
``edit`` and ``write`` change the machine, and each call waits for the user's
approval card unless the tool is always allowed (reference, "Web chat
WebSocket": ``tool_approval_request``, ``approval``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from mlxspec.handlers.webchat.tools import files
from mlxspec.handlers.webchat.tools.app_context import NAMES as APP_NAMES
from mlxspec.handlers.webchat.tools.app_context import tool_spec
from mlxspec.handlers.webchat.tools.shell import Shell
from mlxspec.handlers.webchat.tools.workspace import ToolError, Workspace

if TYPE_CHECKING:
    from mlxspec.handlers.webchat.tools.app_context import AppContext
    from mlxspec.handlers.webchat.tools.mcp_servers import McpServers

__all__ = ["GATED", "TOOLS", "ToolRunner", "definitions", "gated"]

#: Tools whose every call needs an approval (or the tool always allowed); every
#: MCP tool (``mcp__...``) too.
GATED = frozenset({"bash", "edit", "write"})


def gated(name: str) -> bool:
    """Whether a call to tool ``name`` waits for an approval card."""
    return name in GATED or name.startswith("mcp__")


_PATH = {"type": "string", "description": "A path relative to the workspace."}
#: The coding tools as OpenAI function tools, in the order offered.
TOOLS: tuple[dict[str, Any], ...] = (
    tool_spec("read", "Read a text file of the workspace.", {"path": _PATH}, ["path"]),
    tool_spec("ls", "List a folder of the workspace.", {"path": _PATH}, []),
    tool_spec(
        "grep",
        "Find lines matching a regular expression in the workspace's files.",
        {"pattern": {"type": "string"}, "path": _PATH},
        ["pattern"],
    ),
    tool_spec(
        "bash",
        "Run a bash command in the workspace (needs the user's approval).",
        {"command": {"type": "string"}},
        ["command"],
    ),
    tool_spec(
        "edit",
        "Replace the one occurrence of oldText in a file (needs the user's approval).",
        {"path": _PATH, "oldText": {"type": "string"}, "newText": {"type": "string"}},
        ["path", "oldText", "newText"],
    ),
    tool_spec(
        "write",
        "Create or replace a file (needs the user's approval).",
        {"path": _PATH, "content": {"type": "string"}},
        ["path", "content"],
    ),
)
NAMES = frozenset(t["function"]["name"] for t in TOOLS)
_FILE_TOOLS = {"read": files.read, "ls": files.ls, "grep": files.grep,
               "edit": files.edit, "write": files.write}  # fmt: skip


def definitions() -> list[dict[str, Any]]:
    """The tools a turn with coding tools on offers (copies)."""
    return [dict(t) for t in TOOLS]


class ToolRunner:
    """Runs one turn's tool calls: the coding tools in one workspace, and MCP tools.

    Args:
        workspace (Workspace | None): the confined folder; ``None``: no coding tools.
        timeout (float): seconds one call may take.
        limit (int): output bytes one call keeps.
        mcp (McpServers | None): MCP stdio servers (``--mcp-config``). Default: ``None``.
        app (AppContext | None): the page's context and the app tools, offered once
            the page sent a ``context`` frame. Default: ``None``.
    """

    def __init__(
        self,
        workspace: Workspace | None,
        timeout: float,
        limit: int,
        mcp: McpServers | None = None,
        app: AppContext | None = None,
    ) -> None:
        self.workspace, self.timeout, self.limit, self.mcp = workspace, timeout, limit, mcp
        self.app = app if app is not None and app.context is not None else None
        self.shell: Shell | None = None

    async def offered(self) -> list[dict[str, Any]]:
        """The tools a turn offers the model (the MCP servers' listed on first use)."""
        tools = definitions() if self.workspace is not None else []
        if self.mcp is not None:
            tools += [t.definition() for t in (await self.mcp.list_tools()).values()]
        if self.app is not None:
            from mlxspec.handlers.webchat.tools.app_context import APP_TOOLS

            tools += [dict(t) for t in APP_TOOLS]
        return tools

    def offers(self, name: str) -> bool:
        """Whether a call to ``name`` is run by this runner."""
        if self.workspace is not None and name in NAMES:
            return True
        if self.app is not None and name in APP_NAMES:
            return True
        return self.mcp is not None and name in self.mcp.tools

    def kill(self) -> None:
        """Abort the running ``bash`` call, if any (its process group)."""
        if self.shell is not None:
            self.shell.kill()

    async def run(
        self, name: str, args: Any, emit: Callable[[str], Awaitable[None]]
    ) -> tuple[bool, str]:
        """Run one call.

        Args:
            name (str): a name of :data:`TOOLS`.
            args: the call's arguments (a JSON object).
            emit (Callable): sends a chunk of output as it comes (``tool_update``).

        Returns:
            tuple[bool, str]: whether it succeeded, and the result for the model.
        """
        if not isinstance(args, dict):
            return False, "arguments must be a JSON object"
        if self.mcp is not None and name in self.mcp.tools:
            return await self.mcp.call(name, args, self.timeout)
        if self.app is not None and name in APP_NAMES:
            return await self.app.run(name, args)
        if self.workspace is None:
            return False, f"no tool {name!r}"
        try:
            if name == "bash":
                self.shell = Shell(self.workspace, self.timeout, self.limit)
                try:
                    return True, await self.shell.run(args.get("command"), emit)
                finally:
                    self.shell = None
            fn = _FILE_TOOLS[name]
            result = await asyncio.wait_for(
                asyncio.to_thread(fn, self.workspace, args, self.limit), self.timeout
            )
            return True, result
        except ToolError as exc:
            return False, str(exc)
        except TimeoutError:
            return False, f"timed out after {self.timeout:g} s"
        except UnicodeError:
            return False, "not UTF-8 text"
        except OSError as exc:  # a file that vanished, a permission: say which
            return False, f"{type(exc).__name__}: {exc.strerror or exc}"

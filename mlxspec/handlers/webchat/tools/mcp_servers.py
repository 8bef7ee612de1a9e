"""MCP stdio servers as extra web chat tools (``--mcp-config FILE``), through the
official ``mcp`` SDK.

The file is the common ``{"mcpServers": {name: {"command", "args", "env",
"cwd"}}}`` JSON (Claude Desktop's, llama-server's web UI's); servers with a
``url`` instead of a ``command`` are skipped (stdio only). Each server's tools
are listed once, when the chat first opens, and offered to the model as
``mcp__<server>__<tool>``; every call waits for an approval card like ``bash``.
A call starts the server, initializes, calls the tool and closes it again:
no server process outlives a call, so nothing is left running when the chat
or the server stops, at the price of a start per call.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

__all__ = ["McpServers", "McpTool"]

log = logging.getLogger("mlxspec.webchat.mcp")

#: Seconds a server may take to start and list its tools.
LIST_TIMEOUT_S = 30.0


class McpTool:
    """One tool of one server, as offered to the model."""

    def __init__(self, server: str, name: str, description: str, schema: dict[str, Any]) -> None:
        self.server, self.name, self.description, self.schema = server, name, description, schema
        self.exposed = "mcp__" + re.sub(r"[^A-Za-z0-9_-]", "_", f"{server}__{name}")

    def definition(self) -> dict[str, Any]:
        """The OpenAI function tool."""
        return {
            "type": "function",
            "function": {
                "name": self.exposed,
                "description": f"[MCP {self.server}] {self.description}".strip(),
                "parameters": self.schema or {"type": "object", "properties": {}},
            },
        }


class McpServers:
    """The stdio servers of an ``mcpServers`` file and the tools they offer.

    Args:
        path (str | Path): the JSON file.

    Raises:
        ValueError: the file is not JSON with an ``mcpServers`` object.
    """

    def __init__(self, path: str | Path) -> None:
        from mcp import StdioServerParameters

        data = json.loads(Path(path).expanduser().read_text(encoding="utf-8"))
        servers = data.get("mcpServers") if isinstance(data, dict) else None
        if not isinstance(servers, dict):
            raise ValueError(f'--mcp-config: {path} has no "mcpServers" object')
        self.params: dict[str, Any] = {}
        for name, spec in servers.items():
            if not isinstance(spec, dict) or not isinstance(spec.get("command"), str):
                log.warning("MCP server %r has no command (only stdio servers run): skipped", name)
                continue
            env = {**os.environ, **{str(k): str(v) for k, v in (spec.get("env") or {}).items()}}
            self.params[name] = StdioServerParameters(
                command=spec["command"],
                args=[str(a) for a in spec.get("args") or []],
                env=env,
                cwd=spec.get("cwd"),
            )
        self.tools: dict[str, McpTool] = {}
        self._listed = False
        self._lock = asyncio.Lock()

    async def list_tools(self) -> dict[str, McpTool]:
        """List every server's tools (once); a server that fails is logged and left out."""
        async with self._lock:
            if not self._listed:
                for server in self.params:
                    try:
                        listed = await asyncio.wait_for(self._list(server), LIST_TIMEOUT_S)
                    except Exception:
                        log.exception("MCP server %r: cannot list its tools", server)
                        continue
                    for tool in listed:
                        self.tools[tool.exposed] = tool
                self._listed = True
        return self.tools

    async def _list(self, server: str) -> list[McpTool]:
        async with AsyncExitStack() as stack:
            session = await self._open(stack, server)
            result = await session.list_tools()
            return [
                McpTool(server, t.name, t.description or "", dict(t.input_schema or {}))
                for t in result.tools
            ]

    async def _open(self, stack: AsyncExitStack, server: str) -> Any:
        from mcp import ClientSession
        from mcp.client.stdio import stdio_client

        read, write = await stack.enter_async_context(stdio_client(self.params[server]))
        session = await stack.enter_async_context(ClientSession(read, write))
        await session.initialize()
        return session

    async def call(self, exposed: str, args: dict[str, Any], timeout: float) -> tuple[bool, str]:
        """Call tool ``exposed`` with ``args``; returns whether it succeeded and its text."""
        tool = self.tools[exposed]

        async def run() -> Any:
            async with AsyncExitStack() as stack:
                session = await self._open(stack, tool.server)
                return await session.call_tool(tool.name, args)

        try:
            result = await asyncio.wait_for(run(), timeout)
        except TimeoutError:
            return False, f"timed out after {timeout:g} s"
        except Exception as exc:  # the server's failure is the call's result
            return False, f"MCP server {tool.server!r} failed: {type(exc).__name__}: {exc}"
        texts = [getattr(c, "text", None) or json.dumps(_plain(c)) for c in result.content or []]
        return not getattr(result, "is_error", False), "\n".join(texts) or "(no output)"


def _plain(content: Any) -> Any:
    """A non-text content block as JSON-able data (its type and fields)."""
    dump = getattr(content, "model_dump", None)
    return dump(mode="json", exclude_none=True) if callable(dump) else str(content)


def config_error(path: str | Path) -> str | None:
    """Why ``--mcp-config PATH`` cannot be used (a missing or unreadable file, not
    JSON, no ``mcpServers`` object), or ``None``: checked when the server starts, so
    a bad file is a one-line start-up error rather than a web chat that fails to open."""
    try:
        McpServers(path)
    except (OSError, UnicodeError, ValueError) as exc:  # JSONDecodeError is a ValueError
        text = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return text if text.startswith("--mcp-config") else f"--mcp-config {path}: {text}"
    return None

"""The app-aware assistant's three tools (reference, "App-aware assistant").

The page pushes a structured snapshot of what it shows (the ``context``
frame: its route, a wizard step, the visible interactive elements) on every
route or step change; the model may read it (``get_current_app_context``),
move the page (``navigate_app``: ``ui_navigate``) and point at an element
(``spotlight_ui``: ``ui_spotlight``, a brief highlight the page draws). None
acts on the machine, so none waits for an approval card. Routes are checked
against the page's catalog (:data:`APP_ROUTES`): an unknown one is the call's
error and never reaches the page. Every turn's system prompt starts with a
one-line ambient context (``[user is on: Chat]``), never the snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["APP_ROUTES", "APP_TOOLS", "AppContext"]

#: The page's routes (``/#chat``, ``/#status``).
APP_ROUTES = ("chat", "status")
#: Snapshot elements kept (the reference's ~120).
MAX_ELEMENTS = 120
_TARGETS = ("ref", "label", "selector", "target")


def tool_spec(
    name: str, description: str, props: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    """One OpenAI ``tools`` entry (``type: function``) with an object schema."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {"type": "object", "properties": props, "required": required},
        },
    }


_S = {"type": "string"}
#: The three tools, as OpenAI function tools.
APP_TOOLS: tuple[dict[str, Any], ...] = (
    tool_spec(
        "get_current_app_context", "What the user's page shows now: route, step, elements.", {}, []
    ),
    tool_spec(
        "navigate_app",
        f"Move the user's page to a route: one of {', '.join(APP_ROUTES)}.",
        {"route": {"type": "string", "enum": list(APP_ROUTES)}, "page": _S},
        [],
    ),
    tool_spec(
        "spotlight_ui",
        "Briefly highlight an element of the user's page (by ref, label, selector or "
        "target), with an optional message.",
        {"ref": _S, "label": _S, "selector": _S, "target": _S, "route": _S, "message": _S},
        [],
    ),
)
NAMES = frozenset(t["function"]["name"] for t in APP_TOOLS)


class AppContext:
    """What one socket's page last said it shows, and the tools that use it.

    Args:
        send (Callable): sends a frame to the page (``ui_navigate``, ``ui_spotlight``).
    """

    def __init__(self, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
        self.send = send
        self.context: dict[str, Any] | None = None

    def update(self, context: dict[str, Any]) -> None:
        """Keep a ``context`` frame's context (its snapshot cut to :data:`MAX_ELEMENTS`)."""
        context = dict(context)
        snapshot = context.get("snapshot")
        if isinstance(snapshot, dict) and isinstance(snapshot.get("elements"), list):
            context["snapshot"] = {**snapshot, "elements": snapshot["elements"][:MAX_ELEMENTS]}
        self.context = context

    def ambient(self) -> str | None:
        """The one-line context for the system prompt, e.g. ``[user is on: Status · step 2/4]``."""
        if self.context is None:
            return None
        where = str(self.context.get("view") or self.context.get("route") or "?").title()
        step = self.context.get("step")
        if isinstance(step, dict) and isinstance(step.get("index"), int):
            where += f" · step {step['index'] + 1}/{step.get('count', '?')}"
        return f"[user is on: {where}]"

    async def run(self, name: str, args: dict[str, Any]) -> tuple[bool, str]:
        """Run one app tool call; returns whether it succeeded and its result."""
        if name == "get_current_app_context":
            if self.context is None:
                return False, "the page has sent no context yet"
            return True, json.dumps(self.context, ensure_ascii=False)
        if name == "navigate_app":
            route = args.get("route") or args.get("page")
            if route not in APP_ROUTES:
                return False, f"unknown route {route!r}: one of {', '.join(APP_ROUTES)}"
            await self.send({"type": "ui_navigate", "route": route})
            return True, f"the page shows {route}"
        frame = {
            k: args[k] for k in (*_TARGETS, "route", "message") if isinstance(args.get(k), str)
        }
        if not any(k in frame for k in _TARGETS):
            return False, "name the element: ref, label, selector or target"
        if "route" in frame and frame["route"] not in APP_ROUTES:
            return False, f"unknown route {frame['route']!r}: one of {', '.join(APP_ROUTES)}"
        await self.send({"type": "ui_spotlight", **frame})
        return True, "highlighted on the page"

"""``POST /api/sessions/import`` (operationId ``importSession``): an export of
``GET /api/sessions/export`` back in, as a new session (issue 31: export
round-trips).

The document's schema checks each entry's shape (types, roles, sizes);
:func:`parse_entries` checks what a schema cannot: one ``session`` entry,
first; message ids unique; each ``parentId`` naming a message before it (so
the messages form a tree, no cycle); ``leaf`` naming a message. The session
gets a fresh id (the exported one may still be stored); titles, times,
settings (the coding tools off), message ids and the tree are kept, so the
import exports again as the same entries under its new id.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

from mlxspec.errors import ApiError
from mlxspec.handlers.context import JSON
from mlxspec.handlers.webchat.search import chat_store
from mlxspec.handlers.webchat.sessions import SessionSettings

__all__ = ["ImportedMessage", "ImportedSession", "import_session", "parse_entries"]


@dataclass(frozen=True)
class ImportedMessage:
    """One message of an import, as the ``messages`` table holds it.

    Args:
        entry (str): its id; parent (str | None): its parent's id.
        role (str), content (str), reasoning (str | None): the message.
        tool_calls (list): its ``toolCalls``; meta (dict): its ``meta``.
        created (float): its ``timestamp``, Unix seconds.
    """

    entry: str
    parent: str | None
    role: str
    content: str
    reasoning: str | None
    tool_calls: list[Any]
    meta: dict[str, Any]
    created: float


@dataclass(frozen=True)
class ImportedSession:
    """A checked import: the session's fields and its messages in written order."""

    title: str
    created: float
    updated: float
    settings: SessionSettings
    leaf: str | None
    messages: tuple[ImportedMessage, ...]


def _bad(message: str, param: str) -> ApiError:
    return ApiError("invalid_request", message, param=param)


def parse_entries(entries: list[dict[str, Any]]) -> ImportedSession:
    """Check an export's entries (shapes already checked by the document).

    Args:
        entries (list[dict]): ``GET /api/sessions/export``'s ``entries``.

    Returns:
        ImportedSession: what to store.

    Raises:
        ApiError: 400 ``invalid_request`` naming the entry at fault: no leading
            ``session`` entry or a second one, a repeated message id, a
            ``parentId`` that names no earlier message, a ``leaf`` that names no
            message.
    """
    if not entries or entries[0]["type"] != "session":
        raise _bad("the first entry must be the session entry", "entries[0]")
    head = entries[0]
    seen: set[str] = set()
    messages = []
    for i, item in enumerate(entries[1:], start=1):
        if item["type"] != "message":
            raise _bad("only the first entry may be a session entry", f"entries[{i}].type")
        entry, parent = item["id"], item.get("parentId")
        if entry in seen:
            raise _bad(f"message id {entry!r} is repeated", f"entries[{i}].id")
        if parent is not None and parent not in seen:
            raise _bad(
                f"parentId {parent!r} names no message before this one",
                f"entries[{i}].parentId",
            )
        seen.add(entry)
        message = item["message"]
        messages.append(
            ImportedMessage(
                entry,
                parent,
                message["role"],
                message["content"],
                message.get("reasoning"),
                list(message.get("toolCalls") or []),
                dict(message.get("meta") or {}),
                float(item.get("timestamp", head.get("updated", 0.0))),
            )
        )
    leaf = head.get("leaf")
    if leaf is not None and leaf not in seen:
        raise _bad(f"leaf {leaf!r} names no message", "entries[0].leaf")
    return ImportedSession(
        head.get("title") or "Imported chat",
        float(head.get("created", 0.0)),
        float(head.get("updated", 0.0)),
        # the coding tools start off: the user turns them on for the imported chat
        dataclasses.replace(
            SessionSettings.from_wire(head.get("settings") or {}), coding_tools=False
        ),
        leaf,
        tuple(messages),
    )


async def import_session(body: dict[str, Any]) -> Any:
    """``POST /api/sessions/import``: ``{"ok": true, "path", "messages"}``:
    the new session's id and how many messages it holds.

    Raises:
        ApiError: 400 for entries :func:`parse_entries` refuses.
    """
    imported = parse_entries(body["entries"])
    store = await asyncio.to_thread(chat_store)
    sid = await asyncio.to_thread(store.restore, imported)
    return {"ok": True, "path": sid, "messages": len(imported.messages)}, 200, JSON

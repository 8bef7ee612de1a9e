"""``GET /api/sessions/search`` and ``GET /api/sessions/export`` (operationIds
``searchSessions``, ``exportSession``): the web chat's stored conversations,
searched and exported (reference, "GET /api/sessions/search").

Search is case-insensitive over user and assistant message bodies, every
branch included. Queries of 3 characters or more go through the SQLite FTS5
trigram index (``store_schema.FTS``); shorter ones scan with ``LIKE``. Each
message that matches is one match: a plain-text snippet of up to
:data:`CONTEXT_CHARS` characters either side of its first occurrence (``…``
marks a cut), with the ``[start, end)`` offsets of every occurrence inside the
snippet, so a page escapes the text and marks the ranges itself. At most
:data:`PER_SESSION` matches a session and :data:`TOTAL` in all.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path
from typing import Any

from connexion.context import scope

from mlxspec.errors import ApiError
from mlxspec.handlers.context import JSON
from mlxspec.handlers.webchat.sessions import ChatStore
from mlxspec.handlers.webchat.store_schema import walk

__all__ = ["chat_store", "export_entries", "export_session", "search", "search_sessions"]

#: Characters of context either side of a match (the reference's ±60).
CONTEXT_CHARS = 60
#: Matches per session and in all (the reference's caps).
PER_SESSION, TOTAL = 10, 50
#: Rows read from the index before the caps are applied in Python.
_SCAN_ROWS = 5000

_STORES: dict[Path, ChatStore] = {}
_STORES_LOCK = threading.Lock()


def chat_store() -> ChatStore:
    """The sessions database of this server (``--chat-db``), opened once."""
    from mlxspec.http.ws_chat import chat_db_path  # the one rule for the file's place

    path = chat_db_path(scope["state"]["config"]).resolve()
    with _STORES_LOCK:
        if path not in _STORES:
            _STORES[path] = ChatStore(path)
        return _STORES[path]


def snippet(text: str, query: str) -> tuple[str, list[list[int]]] | None:
    """The snippet around ``query``'s first case-insensitive occurrence in
    ``text`` and the ``[start, end)`` ranges of every occurrence in it.

    Returns:
        tuple[str, list[list[int]]] | None: ``None`` when ``query`` is not in ``text``.
    """
    found = [m.span() for m in re.finditer(re.escape(query), text, re.IGNORECASE)]
    if not found:
        return None
    first_start, first_end = found[0]
    start = max(0, first_start - CONTEXT_CHARS)
    end = min(len(text), first_end + CONTEXT_CHARS)
    lead = "…" if start > 0 else ""
    cut = text[start:end] + ("…" if end < len(text) else "")
    shift = len(lead) - start
    ranges = [[a + shift, b + shift] for a, b in found if a >= start and b <= end]
    return lead + cut, ranges


def search(store: ChatStore, query: str) -> list[dict[str, Any]]:
    """The matches of ``query`` across every session, newest session first.

    Returns:
        list[dict]: ``{sessionPath, sessionTitle, matches: [{snippet, ranges,
        role, entryId}]}`` per session with a match.
    """
    if len(query) >= 3:
        phrase = '"' + query.replace('"', '""') + '"'  # one trigram phrase, no operators
        where, param = (
            "m.rowid IN (SELECT rowid FROM messages_fts WHERE messages_fts MATCH ?)",
            phrase,
        )
    else:
        escaped = query.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        where, param = "m.content LIKE ? ESCAPE '\\'", f"%{escaped}%"
    rows = store.query(
        "SELECT s.id, s.title, m.role, m.content, m.entry FROM messages m "
        "JOIN sessions s ON s.id = m.session_id "
        f"WHERE {where} AND m.role IN ('user', 'assistant') "
        "ORDER BY s.updated DESC, s.rowid DESC, m.seq LIMIT ?",
        (param, _SCAN_ROWS),
    )
    results: dict[str, dict[str, Any]] = {}
    total = 0
    for sid, title, role, content, entry in rows:
        found = snippet(content, query)  # LIKE folds ASCII only: Python decides
        if found is None:
            continue
        result = results.setdefault(sid, {"sessionPath": sid, "sessionTitle": title, "matches": []})
        if len(result["matches"]) >= PER_SESSION:
            continue
        text, ranges = found
        result["matches"].append(
            {"snippet": text, "ranges": ranges, "role": role, "entryId": entry}
        )
        total += 1
        if total >= TOTAL:
            break
    return list(results.values())


def export_entries(store: ChatStore, sid: str) -> list[dict[str, Any]] | None:
    """A session as entries: a ``session`` entry (id, title, times, settings,
    ``leaf``), then every ``message`` in the order written, each with its
    ``id`` and ``parentId`` (the tree: walk ``parentId`` up from ``leaf`` for
    the branch shown). ``None`` when there is no such session."""
    head = store.query(
        "SELECT id, title, created, updated, settings, leaf FROM sessions WHERE id = ?", (sid,)
    )
    if not head:
        return None
    sid, title, created, updated, settings, leaf = head[0]
    entries: list[dict[str, Any]] = [
        {"type": "session", "id": sid, "title": title, "created": created, "updated": updated,
         "settings": json.loads(settings), "leaf": leaf}
    ]  # fmt: skip
    rows = store.query(
        "SELECT entry, parent, role, content, reasoning, tool_calls, meta, created FROM messages "
        "WHERE session_id = ? ORDER BY seq",
        (sid,),
    )
    for entry, parent, role, content, reasoning, calls, meta, at in rows:
        message: dict[str, Any] = {"role": role, "content": content}
        if reasoning:
            message["reasoning"] = reasoning
        if calls != "[]":
            message["toolCalls"] = json.loads(calls)
        if meta != "{}":
            message["meta"] = json.loads(meta)
        entries.append(
            {
                "type": "message",
                "id": entry,
                "parentId": parent,
                "timestamp": at,
                "message": message,
            }
        )
    return entries


def shown_branch(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages of an export's shown branch, root first (its ``leaf`` walked up)."""
    by_id = {e["id"]: (e, e["parentId"]) for e in entries if e["type"] == "message"}
    return [by_id[i][0]["message"] for i in walk(by_id, entries[0]["leaf"], parent_at=1)]


async def search_sessions(q: str) -> Any:
    """``GET /api/sessions/search?q=``: ``{"ok": true, "results": [...]}``."""
    results = await asyncio.to_thread(search, await asyncio.to_thread(chat_store), q)
    return {"ok": True, "results": results}, 200, JSON


async def export_session(path: str) -> Any:
    """``GET /api/sessions/export?path=``: ``{"ok": true, "path", "entries"}``.

    Raises:
        ApiError: 404 when there is no session ``path``.
    """
    entries = await asyncio.to_thread(export_entries, await asyncio.to_thread(chat_store), path)
    if entries is None:
        raise ApiError("not_found", f"no chat session {path!r}", param="path")
    return {"ok": True, "path": path, "entries": entries}, 200, JSON

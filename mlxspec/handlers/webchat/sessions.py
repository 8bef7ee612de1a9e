"""The web chat's conversations, kept in one SQLite database.

Each session is a row of ``sessions`` (its title, its settings: system prompt,
sampling fields and the thinking switch, and ``leaf``: the last message of the
branch shown) and its messages are rows of ``messages``, numbered from 0 in the
order written. The messages form a tree (reference, "Web chat WebSocket":
``switch_sibling``, ``siblings``): each names its ``parent`` entry, so a
regenerated answer or an edited question is a sibling of the one it replaces,
never a deletion, and the conversation shown is the path from the root to
``leaf``. A version 1 file (a list per session) is migrated when opened: each
message's parent is the one before it. The database runs in WAL mode, so the socket of
one browser reads while another's turn is written, and a server restart or a
second browser finds every conversation where it was left (reference, "Web
chat WebSocket": sessions outlive the page). The default file is
``chat.sqlite3`` in mlxspec's cache folder (``MLXSPEC_CACHE_DIR``, else
``~/.cache/mlxspec``), made readable by its owner only.

:class:`ChatStore` is synchronous and thread-safe (one connection behind a
lock); the socket calls it through ``asyncio.to_thread`` so a commit's fsync
never stalls the event loop.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlxspec.handlers.webchat.store_schema import (
    FTS,
    INDEX,
    MIGRATE_1_2,
    PATHS,
    SCHEMA,
    SCHEMA_VERSION,
    walk,
)

if TYPE_CHECKING:
    from mlxspec.handlers.webchat.session_import import ImportedSession

__all__ = [
    "ChatMessage",
    "ChatStore",
    "Session",
    "SessionSettings",
    "SessionSummary",
    "new_session_id",
]

#: Characters of the first user message a session's title keeps.
TITLE_CHARS = 60
#: Sessions a list holds (older ones stay stored, and open by id).
LIST_LIMIT = 500


@dataclass(frozen=True)
class ChatMessage:
    """One turn of a conversation.

    Args:
        role (str): ``"user"``, ``"assistant"`` or ``"tool"`` (a coding tool's
            result; ``meta`` holds ``toolCallId``, ``tool`` and ``ok``).
        content (str): the text (an assistant's answer as far as it got).
        reasoning (str | None): the thinking channel, when the model used one.
            Default: ``None``.
        tool_calls (tuple[dict, ...]): calls the answer made, OpenAI-shaped
            (``{"id", "type": "function", "function": {"name", "arguments"}}``);
            shown, never run. Default: ``()``.
        meta (dict): what the page shows beside the answer: ``finishReason``,
            ``lane``, ``usage``, ``stats``, ``sampling``. Default: ``{}``.
        entry (str | None): the stored message's entry id (``e-<16 hex>``);
            ``None`` before it is stored. Default: ``None``.
        siblings (tuple[str, ...]): the entry ids of the messages with the same
            parent, itself included, oldest first (``()`` unknown). Default: ``()``.
    """

    role: str
    content: str
    reasoning: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)
    entry: str | None = None
    siblings: tuple[str, ...] = ()

    def wire(self) -> dict[str, Any]:
        """The message as a ``history`` frame item (``entryId``; ``siblings``
        when it has any: ``{index, count, siblingIds}``)."""
        item: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.entry is not None:
            item["entryId"] = self.entry
        if len(self.siblings) > 1 and self.entry in self.siblings:
            item["siblings"] = sibling_view(self.entry, self.siblings)
        if self.reasoning:
            item["reasoning"] = self.reasoning
        if self.tool_calls:
            item["toolCalls"] = list(self.tool_calls)
        if self.meta:
            item["meta"] = self.meta
        return item


@dataclass(frozen=True)
class SessionSettings:
    """What a session runs its turns with.

    Args:
        system_prompt (str | None): the system message; ``None`` for none.
        sampling (dict): sampling fields (``temperature``, ``top_p``, ``top_k``,
            ``min_p``, ``max_tokens``, ``seed`` and the penalties); an absent
            field is the server's default.
        thinking (bool | None): the template's ``enable_thinking``; ``None``
            leaves the template's default.
        tools (tuple[dict, ...]): OpenAI function tools the model may call;
            its calls are shown, never run. Default: ``()``.
        adapter (str | None): the chat body's ``adapter`` (a mounted id,
            ``"a+b"``, ``"none"``); ``None`` is the server's default. Default: ``None``.
        coding_tools (bool): the coding tools are offered and run
            (``set_coding_tools``; only on a server with ``--web-tools``).
            Default: ``False``.
    """

    system_prompt: str | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    thinking: bool | None = None
    tools: tuple[dict[str, Any], ...] = ()
    adapter: str | None = None
    coding_tools: bool = False

    def wire(self) -> dict[str, Any]:
        """The settings as frames carry them (camelCase, as the reference's frames)."""
        return {
            "systemPrompt": self.system_prompt,
            "sampling": dict(self.sampling),
            "thinking": self.thinking,
            "tools": list(self.tools),
            "adapter": self.adapter,
            "codingTools": self.coding_tools,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> SessionSettings:
        """Settings as :meth:`wire` wrote them (unknown keys ignored)."""
        return cls(
            data.get("systemPrompt"),
            dict(data.get("sampling") or {}),
            data.get("thinking"),
            tuple(data.get("tools") or ()),
            data.get("adapter"),
            bool(data.get("codingTools", False)),
        )


@dataclass(frozen=True)
class SessionSummary:
    """A row of the conversation list.

    Args:
        id (str): the session id (``chat-<uuid4>``).
        title (str): the first user message, cut to :data:`TITLE_CHARS`.
        created (float): Unix seconds.
        updated (float): Unix seconds of the last change.
        messages (int): turns stored.
    """

    id: str
    title: str
    created: float
    updated: float
    messages: int

    def wire(self) -> dict[str, Any]:
        """The summary as a ``sessions`` frame item."""
        return {
            "path": self.id,  # the reference's field: a session's stable name
            "id": self.id,
            "title": self.title,
            "created": self.created,
            "updated": self.updated,
            "messages": self.messages,
        }


@dataclass(frozen=True)
class Session:
    """A whole conversation: its summary, settings and messages in order."""

    summary: SessionSummary
    settings: SessionSettings
    messages: tuple[ChatMessage, ...]


def sibling_view(entry: str, siblings: tuple[str, ...]) -> dict[str, Any]:
    """``{index, count, siblingIds}`` of ``entry`` among ``siblings`` (the
    reference's ``siblings`` frame, without its type)."""
    return {"index": siblings.index(entry), "count": len(siblings), "siblingIds": list(siblings)}


def new_entry_id() -> str:
    """A fresh message entry id (``e-<16 hex>``)."""
    return f"e-{uuid.uuid4().hex[:16]}"


def title_of(text: str) -> str:
    """A session title from its first user message: one line, at most
    :data:`TITLE_CHARS` characters (``…`` marks a cut)."""
    line = " ".join(text.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


def new_session_id() -> str:
    """A fresh session id (``chat-<uuid4>``): a turn names its session before
    the session is stored (its prompt cache key)."""
    return f"chat-{uuid.uuid4()}"


class ChatStore:
    """The SQLite database of web chat sessions.

    Args:
        path (Path): the database file; its folder is created (mode 0700).

    Raises:
        sqlite3.Error: the file cannot be opened as a database.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fresh = not self.path.exists()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        if fresh:  # conversations are private: owner-only, like ~/.ssh's files
            os.chmod(self.path, 0o600)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints (WAL)
            self._db.execute("PRAGMA foreign_keys=ON")
            self._db.execute("PRAGMA busy_timeout=5000")  # a second server on the file
            self._db.executescript(SCHEMA)
            columns = {row[1] for row in self._db.execute("PRAGMA table_info(messages)")}
            if "entry" not in columns:  # a version 1 file: one list per session
                self._db.executescript(f"BEGIN IMMEDIATE;{MIGRATE_1_2}COMMIT;")
            self._db.executescript(INDEX)
            indexed = self._db.execute(
                "SELECT 1 FROM sqlite_master WHERE name = 'messages_fts'"
            ).fetchone()
            self._db.executescript(FTS)
            if indexed is None:  # a file written before the index: index what it holds
                self._db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
            self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def query(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """The rows of a read-only statement (the search and export routes)."""
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def journal_mode(self) -> str:
        """The database's journal mode (``"wal"``)."""
        with self._lock:
            return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    def create(
        self, settings: SessionSettings, title: str = "New chat", sid: str | None = None
    ) -> str:
        """A new, empty session; returns its id (``sid``, else a fresh one:
        :func:`new_session_id`)."""
        sid, now = sid or new_session_id(), time.time()
        with self._write() as db:
            db.execute(
                "INSERT INTO sessions (id, title, created, updated, settings) "
                "VALUES (?, ?, ?, ?, ?)",
                (sid, title, now, now, json.dumps(settings.wire())),
            )
        return sid

    def list(self, limit: int = LIST_LIMIT) -> list[SessionSummary]:
        """The most recently changed sessions first, at most ``limit`` of them
        (every ``sessions`` frame carries the list)."""
        with self._lock:
            rows = self._db.execute(
                PATHS + "SELECT s.id, s.title, s.created, s.updated, "
                "(SELECT COUNT(*) FROM path WHERE path.session_id = s.id) FROM sessions s "
                "ORDER BY s.updated DESC, s.rowid DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [SessionSummary(*row) for row in rows]

    def get(self, sid: str) -> Session | None:
        """The session ``sid`` with the messages of its shown branch, or ``None``."""
        with self._lock:
            row = self._db.execute(
                "SELECT id, title, created, updated, settings, leaf FROM sessions WHERE id = ?",
                (sid,),
            ).fetchone()
            if row is None:
                return None
            rows = self._db.execute(
                "SELECT role, content, reasoning, tool_calls, meta, entry, parent FROM messages "
                "WHERE session_id = ? ORDER BY seq",
                (sid,),
            ).fetchall()
        by_entry = {r[5]: r for r in rows}
        children: dict[str | None, list[str]] = {}
        for r in rows:
            children.setdefault(r[6], []).append(r[5])
        messages = tuple(
            ChatMessage(
                role,
                content,
                reasoning,
                tuple(json.loads(calls)),
                json.loads(meta),
                entry,
                tuple(children[parent]),
            )  # fmt: skip
            for role, content, reasoning, calls, meta, entry, parent in (
                by_entry[e] for e in walk(by_entry, row[5])
            )
        )
        summary = SessionSummary(row[0], row[1], row[2], row[3], len(messages))
        return Session(summary, SessionSettings.from_wire(json.loads(row[4])), messages)

    def append(self, sid: str, message: ChatMessage, keep: int | None = None) -> str:
        """Add ``message`` after the shown branch's last message; with ``keep``,
        after its first ``keep`` messages instead, as a sibling of the one there
        (regenerate, edit and resend), which stays stored. The new message ends
        the shown branch. A first user message names the session.

        Returns:
            str: the new message's entry id.
        """
        now, entry = time.time(), new_entry_id()
        with self._write() as db:
            path = self._path(db, sid)
            kept = path if keep is None else path[:keep]
            parent = kept[-1] if kept else None
            (seq,) = db.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE session_id = ?", (sid,)
            ).fetchone()
            db.execute(
                "INSERT INTO messages (session_id, seq, role, content, reasoning, tool_calls, "
                "meta, created, entry, parent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    sid,
                    seq,
                    message.role,
                    message.content,
                    message.reasoning,
                    json.dumps(list(message.tool_calls)),
                    json.dumps(message.meta),
                    now,
                    entry,
                    parent,
                ),
            )
            db.execute("UPDATE sessions SET updated = ?, leaf = ? WHERE id = ?", (now, entry, sid))
            if parent is None and message.role == "user":
                db.execute(
                    "UPDATE sessions SET title = ? WHERE id = ?", (title_of(message.content), sid)
                )
        return entry

    def truncate(self, sid: str, keep: int) -> None:
        """Show only the first ``keep`` messages of the shown branch (the rest
        stay stored: the next message appended is their sibling)."""
        with self._write() as db:
            path = self._path(db, sid)[:keep]
            leaf = path[-1] if path else None
            db.execute(
                "UPDATE sessions SET updated = ?, leaf = ? WHERE id = ?", (time.time(), leaf, sid)
            )

    def switch(self, sid: str, entry: str) -> bool:
        """Show the branch through ``entry``: down from it, the most recent
        child each time. ``False`` when ``sid`` has no such entry."""
        with self._write() as db:
            rows = db.execute(
                "SELECT entry, parent FROM messages WHERE session_id = ? ORDER BY seq", (sid,)
            ).fetchall()
            if entry not in {e for e, _ in rows}:
                return False
            latest = {parent: child for child, parent in rows}  # the last written wins
            leaf = entry
            while leaf in latest:
                leaf = latest[leaf]
            db.execute(
                "UPDATE sessions SET leaf = ?, updated = ? WHERE id = ?", (leaf, time.time(), sid)
            )
        return True

    @staticmethod
    def _path(db: sqlite3.Connection, sid: str) -> tuple[str, ...]:
        """The shown branch's entries, root first (inside a transaction)."""
        row = db.execute("SELECT leaf FROM sessions WHERE id = ?", (sid,)).fetchone()
        rows = db.execute(
            "SELECT entry, parent FROM messages WHERE session_id = ?", (sid,)
        ).fetchall()
        return tuple(walk({e: (e, p) for e, p in rows}, row[0] if row else None, parent_at=1))

    def set_settings(self, sid: str, settings: SessionSettings) -> None:
        """Replace the settings of ``sid``."""
        with self._write() as db:
            db.execute(
                "UPDATE sessions SET settings = ? WHERE id = ?", (json.dumps(settings.wire()), sid)
            )

    def fork(self, sid: str) -> str | None:
        """A copy of ``sid`` (settings and messages) under a new id, or ``None``
        when there is no such session."""
        new, now = new_session_id(), time.time()
        with self._write() as db:
            row = db.execute("SELECT title FROM sessions WHERE id = ?", (sid,)).fetchone()
            if row is None:
                return None
            db.execute(
                "INSERT INTO sessions (id, title, created, updated, settings, leaf) "
                "SELECT ?, title, ?, ?, settings, leaf FROM sessions WHERE id = ?",
                (new, now, now, sid),
            )
            db.execute(
                "INSERT INTO messages SELECT ?, seq, role, content, reasoning, tool_calls, meta, "
                "created, entry, parent FROM messages WHERE session_id = ?",
                (new, sid),
            )
        return new

    def restore(self, imported: ImportedSession) -> str:
        """Store an import (:mod:`.session_import`, checked) as a new session, in
        one transaction; returns its fresh id."""
        sid = new_session_id()
        with self._write() as db:
            db.execute(
                "INSERT INTO sessions (id, title, created, updated, settings, leaf) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (sid, imported.title, imported.created, imported.updated,
                 json.dumps(imported.settings.wire()), imported.leaf),
            )  # fmt: skip
            db.executemany(
                "INSERT INTO messages (session_id, seq, role, content, reasoning, tool_calls, "
                "meta, created, entry, parent) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(sid, seq, m.role, m.content, m.reasoning, json.dumps(m.tool_calls),
                  json.dumps(m.meta), m.created, m.entry, m.parent)
                 for seq, m in enumerate(imported.messages)],
            )  # fmt: skip
        return sid

    def delete(self, sid: str) -> bool:
        """Delete ``sid`` and its messages; ``False`` when there was none."""
        with self._write() as db:
            return db.execute("DELETE FROM sessions WHERE id = ?", (sid,)).rowcount > 0

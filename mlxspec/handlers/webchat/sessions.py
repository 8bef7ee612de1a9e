"""The web chat's conversations, kept in one SQLite database.

Each session is a row of ``sessions`` (its title, its settings: system prompt,
sampling fields and the thinking switch) and its turns are rows of
``messages``, numbered from 0. The database runs in WAL mode, so the socket of
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
from typing import Any

__all__ = [
    "ChatMessage",
    "ChatStore",
    "Session",
    "SessionSettings",
    "SessionSummary",
    "new_session_id",
]

#: The schema's version, kept in ``PRAGMA user_version``.
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id       TEXT PRIMARY KEY,
    title    TEXT NOT NULL,
    created  REAL NOT NULL,
    updated  REAL NOT NULL,
    settings TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
    seq        INTEGER NOT NULL,
    role       TEXT NOT NULL,
    content    TEXT NOT NULL,
    reasoning  TEXT,
    tool_calls TEXT NOT NULL DEFAULT '[]',
    meta       TEXT NOT NULL DEFAULT '{}',
    created    REAL NOT NULL,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX IF NOT EXISTS sessions_by_update ON sessions(updated DESC);
"""

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
    """

    role: str
    content: str
    reasoning: str | None = None
    tool_calls: tuple[dict[str, Any], ...] = ()
    meta: dict[str, Any] = field(default_factory=dict)

    def wire(self) -> dict[str, Any]:
        """The message as a ``history`` frame item."""
        item: dict[str, Any] = {"role": self.role, "content": self.content}
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
            self._db.executescript(_SCHEMA)
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
                "INSERT INTO sessions VALUES (?, ?, ?, ?, ?)",
                (sid, title, now, now, json.dumps(settings.wire())),
            )
        return sid

    def list(self, limit: int = LIST_LIMIT) -> list[SessionSummary]:
        """The most recently changed sessions first, at most ``limit`` of them
        (every ``sessions`` frame carries the list)."""
        with self._lock:
            rows = self._db.execute(
                "SELECT s.id, s.title, s.created, s.updated, COUNT(m.seq) FROM sessions s "
                "LEFT JOIN messages m ON m.session_id = s.id GROUP BY s.id "
                "ORDER BY s.updated DESC, s.rowid DESC LIMIT ?",
                (limit,),
            ).fetchall()
        return [SessionSummary(*row) for row in rows]

    def get(self, sid: str) -> Session | None:
        """The session ``sid``, or ``None`` when there is none."""
        with self._lock:
            row = self._db.execute(
                "SELECT id, title, created, updated, settings FROM sessions WHERE id = ?", (sid,)
            ).fetchone()
            if row is None:
                return None
            rows = self._db.execute(
                "SELECT role, content, reasoning, tool_calls, meta FROM messages "
                "WHERE session_id = ? ORDER BY seq",
                (sid,),
            ).fetchall()
        messages = tuple(
            ChatMessage(role, content, reasoning, tuple(json.loads(calls)), json.loads(meta))
            for role, content, reasoning, calls, meta in rows
        )
        summary = SessionSummary(row[0], row[1], row[2], row[3], len(messages))
        return Session(summary, SessionSettings.from_wire(json.loads(row[4])), messages)

    def append(self, sid: str, message: ChatMessage, keep: int | None = None) -> None:
        """Add ``message`` after the session's last one; with ``keep``, first
        drop every message from index ``keep`` on (regenerate, edit and resend).
        The first user message names an untitled session."""
        now = time.time()
        with self._write() as db:
            if keep is not None:
                db.execute("DELETE FROM messages WHERE session_id = ? AND seq >= ?", (sid, keep))
            (seq,) = db.execute(
                "SELECT COALESCE(MAX(seq) + 1, 0) FROM messages WHERE session_id = ?", (sid,)
            ).fetchone()
            db.execute(
                "INSERT INTO messages VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    sid,
                    seq,
                    message.role,
                    message.content,
                    message.reasoning,
                    json.dumps(list(message.tool_calls)),
                    json.dumps(message.meta),
                    now,
                ),
            )
            db.execute("UPDATE sessions SET updated = ? WHERE id = ?", (now, sid))
            if seq == 0 and message.role == "user":
                db.execute(
                    "UPDATE sessions SET title = ? WHERE id = ?", (title_of(message.content), sid)
                )

    def truncate(self, sid: str, keep: int) -> None:
        """Drop every message of ``sid`` from index ``keep`` on."""
        with self._write() as db:
            db.execute("DELETE FROM messages WHERE session_id = ? AND seq >= ?", (sid, keep))
            db.execute("UPDATE sessions SET updated = ? WHERE id = ?", (time.time(), sid))

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
            row = db.execute("SELECT title, settings FROM sessions WHERE id = ?", (sid,)).fetchone()
            if row is None:
                return None
            db.execute(
                "INSERT INTO sessions VALUES (?, ?, ?, ?, ?)", (new, row[0], now, now, row[1])
            )
            db.execute(
                "INSERT INTO messages SELECT ?, seq, role, content, reasoning, tool_calls, meta, "
                "created FROM messages WHERE session_id = ?",
                (new, sid),
            )
        return new

    def delete(self, sid: str) -> bool:
        """Delete ``sid`` and its messages; ``False`` when there was none."""
        with self._write() as db:
            return db.execute("DELETE FROM sessions WHERE id = ?", (sid,)).rowcount > 0

"""The web chat database's schema, its migration and the walk of a branch.

Version 2 (the message tree, issue 31): each message names its ``parent``
entry and each session its ``leaf``; a version 1 file (one list per session)
is migrated in one transaction when opened.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FTS", "INDEX", "MIGRATE_1_2", "PATHS", "SCHEMA", "SCHEMA_VERSION", "walk"]

#: The schema's version, kept in ``PRAGMA user_version`` (2: the message tree).
SCHEMA_VERSION = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    id       TEXT PRIMARY KEY,
    title    TEXT NOT NULL,
    created  REAL NOT NULL,
    updated  REAL NOT NULL,
    settings TEXT NOT NULL,
    leaf     TEXT
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
    entry      TEXT,
    parent     TEXT,
    PRIMARY KEY (session_id, seq)
);
CREATE INDEX IF NOT EXISTS sessions_by_update ON sessions(updated DESC);
"""

#: Version 1 -> 2: entries and parents (each message's parent is the one
#: before it), the leaf is the last message.
MIGRATE_1_2 = """
ALTER TABLE messages ADD COLUMN entry TEXT;
ALTER TABLE messages ADD COLUMN parent TEXT;
ALTER TABLE sessions ADD COLUMN leaf TEXT;
UPDATE messages SET entry = 'e-' || lower(hex(randomblob(8)));
UPDATE messages SET parent = (SELECT p.entry FROM messages p
    WHERE p.session_id = messages.session_id AND p.seq = messages.seq - 1);
UPDATE sessions SET leaf = (SELECT m.entry FROM messages m
    WHERE m.session_id = sessions.id ORDER BY m.seq DESC LIMIT 1);
"""
INDEX = "CREATE INDEX IF NOT EXISTS messages_by_entry ON messages(session_id, entry);"

#: Full-text search over message bodies (``GET /api/sessions/search``): an
#: external-content FTS5 table on ``messages`` with the trigram tokenizer
#: (case-insensitive substrings of 3 characters or more), kept by triggers;
#: messages are written once and deleted with their session, never updated.
FTS = """
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content, content='messages', content_rowid='rowid', tokenize='trigram');
CREATE TRIGGER IF NOT EXISTS messages_fts_insert AFTER INSERT ON messages BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.rowid, new.content);
END;
CREATE TRIGGER IF NOT EXISTS messages_fts_delete AFTER DELETE ON messages BEGIN
    INSERT INTO messages_fts(messages_fts, rowid, content)
        VALUES ('delete', old.rowid, old.content);
END;
"""

#: Each session's shown branch: the entries from its leaf up to the root.
PATHS = """
WITH RECURSIVE path(session_id, entry, parent) AS (
    SELECT m.session_id, m.entry, m.parent FROM messages m
        JOIN sessions s ON m.session_id = s.id AND m.entry = s.leaf
    UNION ALL
    SELECT m.session_id, m.entry, m.parent FROM messages m
        JOIN path p ON m.session_id = p.session_id AND m.entry = p.parent
)
"""


def walk(rows: dict[Any, Any], leaf: str | None, parent_at: int = 6) -> list[str]:
    """Entry ids from the root down to ``leaf``, following each row's parent
    (``rows[entry][parent_at]``); a cycle or a missing parent ends the walk."""
    path: list[str] = []
    seen: set[str] = set()
    entry = leaf
    while entry is not None and entry in rows and entry not in seen:
        seen.add(entry)
        path.append(entry)
        entry = rows[entry][parent_at]
    path.reverse()
    return path

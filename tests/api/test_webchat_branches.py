"""Branching history over ``/ws/chat``: regenerate and edit keep the old
messages as siblings, ``switch_sibling`` moves the shown branch, the tree
outlives the socket and the server, and a version 1 database is migrated.

Turns run on the tiny random model (answers are only told apart by their
entry ids); every server frame is checked against the document.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxspec.config import ServeConfig
from mlxspec.handlers.webchat.sessions import ChatMessage, ChatStore, SessionSettings
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.webchat_client import ChatClient


@pytest.fixture(scope="module")
def chat_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("branches") / "chat.sqlite3"


@pytest.fixture(scope="module")
def server(tiny_engine: Any, chat_db: Path) -> Iterator[LiveServer]:
    app = create_app(tiny_engine, ServeConfig(chat_db=str(chat_db)), validate_responses=True)
    with LiveServer(app) as live:
        yield live


def history_of(frames: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return next(f for f in reversed(frames) if f["type"] == "history")["items"]


def test_two_regenerates_switch_back_and_survive_a_reload(server: LiveServer) -> None:
    with ChatClient(server.base) as chat:
        chat.send({"type": "set_sampling", "max_tokens": 2})
        chat.turn({"type": "prompt", "text": "branch me"})
        chat.send({"type": "list_sessions"})
        sid = chat.until("sessions")[-1]["activePath"]
        answers = []
        for _ in range(2):
            chat.turn({"type": "regenerate"})
            chat.send({"type": "open_session", "path": sid})
            answers.append(history_of(chat.until("history"))[-1])
        newest = answers[-1]
        assert newest["siblings"]["count"] == 3 and newest["siblings"]["index"] == 2
        ids = newest["siblings"]["siblingIds"]
        assert ids[2] == newest["entryId"] and len(set(ids)) == 3
        chat.send({"type": "switch_sibling", "entryId": ids[0]})
        frames = chat.until("siblings")
        items = history_of(frames)
        assert [m["role"] for m in items] == ["user", "assistant"]
        assert items[1]["entryId"] == ids[0] and items[1]["siblings"]["index"] == 0
        assert frames[-1] == {
            "type": "siblings",
            "entryId": ids[0],
            "index": 0,
            "count": 3,
            "siblingIds": ids,
        }
        user = items[0]
    with ChatClient(server.base) as again:  # a reload: the branch shown is kept
        again.send({"type": "open_session", "path": sid})
        items = history_of(again.until("history"))
        assert [m["entryId"] for m in items] == [user["entryId"], ids[0]]
        listed = {s["path"]: s for s in again.until("sessions")[-1]["items"]}
        assert listed[sid]["messages"] == 2  # the shown branch's messages


def test_edit_resend_branches_the_question_and_its_answers(server: LiveServer) -> None:
    with ChatClient(server.base) as chat:
        chat.send({"type": "set_sampling", "max_tokens": 2})
        chat.turn({"type": "prompt", "text": "first question"})
        chat.turn({"type": "edit_resend", "text": "second question"})
        chat.send({"type": "list_sessions"})
        sid = chat.until("sessions")[-1]["activePath"]
        chat.send({"type": "open_session", "path": sid})
        items = history_of(chat.until("history"))
        assert [m["content"] for m in items][:1] == ["second question"]
        old = items[0]["siblings"]["siblingIds"][0]
        chat.send({"type": "switch_sibling", "entryId": old})
        items = history_of(chat.until("siblings"))
        assert items[0]["content"] == "first question" and len(items) == 2  # with its answer
        chat.send({"type": "switch_sibling", "entryId": "e-nope"})
        error = chat.until("error")[-1]
        assert error["message"] == "no message 'e-nope' in this chat"
        assert error["param"] == "entryId"
        chat.send({"type": "new_session"})
        chat.until("history")
        chat.send({"type": "switch_sibling", "entryId": old})
        assert chat.until("error")[-1]["message"] == "this chat has no messages yet"


def test_a_version_1_database_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript(
        """
        CREATE TABLE sessions (id TEXT PRIMARY KEY, title TEXT NOT NULL, created REAL NOT NULL,
            updated REAL NOT NULL, settings TEXT NOT NULL);
        CREATE TABLE messages (session_id TEXT NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
            seq INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL, reasoning TEXT,
            tool_calls TEXT NOT NULL DEFAULT '[]', meta TEXT NOT NULL DEFAULT '{}',
            created REAL NOT NULL, PRIMARY KEY (session_id, seq));
        PRAGMA user_version=1;
        """
    )
    settings = json.dumps(SessionSettings().wire())
    db.execute("INSERT INTO sessions VALUES ('chat-old', 'old one', 1, 2, ?)", (settings,))
    for seq, (role, text) in enumerate([("user", "q"), ("assistant", "a"), ("user", "q2")]):
        db.execute(
            "INSERT INTO messages VALUES ('chat-old', ?, ?, ?, NULL, '[]', '{}', 1)",
            (seq, role, text),
        )
    db.commit()
    db.close()
    store = ChatStore(path)
    session = store.get("chat-old")
    assert session is not None
    assert [(m.role, m.content) for m in session.messages] == [
        ("user", "q"),
        ("assistant", "a"),
        ("user", "q2"),
    ]
    assert all(m.entry and m.siblings == (m.entry,) for m in session.messages)
    assert store.list()[0].messages == 3
    store.append("chat-old", ChatMessage("assistant", "a2"))
    store.append("chat-old", ChatMessage("user", "q2 edited"), 2)  # a sibling of q2
    session = store.get("chat-old")
    assert session is not None
    assert [m.content for m in session.messages] == ["q", "a", "q2 edited"]
    assert len(session.messages[2].siblings) == 2
    store.close()
    check = sqlite3.connect(path)
    assert check.execute("PRAGMA user_version").fetchone()[0] == 2
    check.close()

"""The web chat's SQLite sessions store, without a server."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from mlxspec.config import ServeConfig
from mlxspec.handlers.webchat.sessions import ChatMessage, ChatStore, SessionSettings, title_of
from mlxspec.handlers.webchat.turn import chat_body
from mlxspec.http.ws_chat import chat_db_path

SETTINGS = SessionSettings("Be brief.", {"temperature": 0.5, "max_tokens": 9}, thinking=False)


@pytest.fixture()
def store(tmp_path: Path) -> ChatStore:
    return ChatStore(tmp_path / "deep" / "chat.sqlite3")


def test_the_store_is_wal_and_private(store: ChatStore) -> None:
    assert store.journal_mode() == "wal"
    assert (store.path.stat().st_mode & 0o777) == 0o600
    assert (store.path.parent.stat().st_mode & 0o777) == 0o700


def test_a_session_keeps_its_messages_settings_and_title(store: ChatStore) -> None:
    sid = store.create(SETTINGS)
    assert store.get(sid).summary.title == "New chat"
    store.append(sid, ChatMessage("user", "  What is\n the KV cache?  "))
    answer = ChatMessage(
        "assistant", "Keys and values.", "think", ({"id": "c1"},), {"lane": "serial"}
    )
    store.append(sid, answer)
    session = store.get(sid)
    assert session.summary.title == "What is the KV cache?"
    assert session.settings == SETTINGS
    stored = session.messages[1]
    assert dataclasses.replace(stored, entry=None, siblings=()) == answer
    assert stored.entry is not None and stored.entry.startswith("e-")  # its stored entry id
    assert [s.messages for s in store.list()] == [2]


def test_truncate_and_replace_from_an_index(store: ChatStore) -> None:
    sid = store.create(SessionSettings())
    for text in ("one", "two", "three"):
        store.append(sid, ChatMessage("user", text))
    store.append(sid, ChatMessage("user", "TWO"), keep=1)  # edit and resend the second
    assert [m.content for m in store.get(sid).messages] == ["one", "TWO"]
    store.truncate(sid, 1)
    assert [m.content for m in store.get(sid).messages] == ["one"]
    store.append(sid, ChatMessage("user", "first edited"), keep=0)
    assert store.get(sid).summary.title == "first edited"


def test_fork_delete_and_the_list_order(store: ChatStore) -> None:
    first = store.create(SETTINGS)
    store.append(first, ChatMessage("user", "original"))
    second = store.create(SessionSettings())
    copy = store.fork(first)
    assert copy is not None and copy != first
    assert store.get(copy).messages == store.get(first).messages
    assert store.get(copy).settings == SETTINGS
    assert store.list()[0].id == copy  # newest change first
    assert [s.id for s in store.list(limit=2)] == [copy, second]
    assert store.delete(first) and not store.delete(first)
    assert store.get(first) is None and store.fork(first) is None
    assert store.get(copy).messages[0].content == "original"  # the fork is its own


def test_sessions_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "chat.sqlite3"
    store = ChatStore(path)
    sid = store.create(SETTINGS)
    store.append(sid, ChatMessage("user", "still here?"))
    store.close()
    again = ChatStore(path)
    (kept,) = again.get(sid).messages
    assert dataclasses.replace(kept, entry=None, siblings=()) == ChatMessage("user", "still here?")
    assert kept.entry is not None and kept.entry.startswith("e-")  # its stored entry id


def test_titles_are_one_short_line() -> None:
    assert title_of("a\n\tb  c") == "a b c"
    long = title_of("x" * 100)
    assert len(long) == 60 and long.endswith("…")


def test_a_turns_body_is_a_chat_completion_body() -> None:
    settings = SessionSettings("Sys", {"temperature": 0.2, "seed": None}, True, ({"t": 1},))
    messages = [
        ChatMessage("user", "q"),
        ChatMessage("assistant", "", tool_calls=({"id": "c", "type": "function"},)),
    ]
    body = chat_body("chat-1", settings, messages, {"max_tokens": 3})
    assert body == {
        "messages": [
            {"role": "system", "content": "Sys"},
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function"}]},
        ],
        "session_id": "chat-1",  # the prompt cache's session too
        "temperature": 0.2,
        "max_tokens": 3,
        "chat_template_kwargs": {"enable_thinking": True},
        "tools": [{"t": 1}],
    }


def test_the_default_database_is_in_the_cache_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path))
    assert chat_db_path(ServeConfig()) == tmp_path / "chat.sqlite3"
    assert chat_db_path(ServeConfig(chat_db="~/x.db")) == Path.home() / "x.db"

"""``/ws/chat``: a turn the engine refuses changes nothing (issue 25, item 4).

A prompt over the tiny model's 256-token window is a ``context_length_exceeded``
``error`` frame and a ``turn_end``: no session, message or truncation is stored
(the refused first prompt was saved as a new conversation before), and no
frame after the ``error`` says otherwise (no ``history`` or ``sessions`` of it).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxspec.config import ServeConfig
from mlxspec.handlers.webchat.sessions import ChatStore
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.webchat_client import ChatClient

TOO_LONG = "hello " * 400  # past the tiny model's 256-token window


@pytest.fixture(scope="module")
def chat_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("refused") / "chat.sqlite3"


@pytest.fixture(scope="module")
def chat_server(tiny_engine: Any, chat_db: Path) -> Iterator[LiveServer]:
    app = create_app(tiny_engine, ServeConfig(chat_db=str(chat_db)), validate_responses=True)
    with LiveServer(app) as server:
        yield server


def stored(chat_db: Path) -> dict[str, int]:
    """Session id -> message count, read from the database file."""
    store = ChatStore(chat_db)
    try:
        return {s.id: s.messages for s in store.list()}
    finally:
        store.close()


def refused(chat: ChatClient, frame: dict[str, Any]) -> list[dict[str, Any]]:
    """Send a turn the engine refuses; its frames up to ``turn_end``, and no more."""
    chat.send(frame)
    frames = chat.until("turn_end")
    with pytest.raises(TimeoutError):
        chat.recv(timeout=0.5)  # nothing follows: no history, sessions or context of it
    return frames


def test_a_refused_first_prompt_creates_no_conversation(
    chat_server: LiveServer, chat_db: Path
) -> None:
    before = stored(chat_db)
    with ChatClient(chat_server.base) as chat:
        frames = refused(chat, {"type": "prompt", "text": TOO_LONG})
        assert [f["type"] for f in frames] == ["error", "turn_end"]
        assert frames[0]["code"] == "context_length_exceeded"
        assert frames[0]["param"] == "messages"
        assert frames[1]["finishReason"] == "error"
        chat.send({"type": "list_sessions"})
        assert chat.until("sessions")[-1]["items"] == chat.greeting["sessions"]["items"]
        # the blank chat is still blank: the next prompt starts the conversation
        chat.send({"type": "set_sampling", "max_tokens": 2})
        chat.send({"type": "prompt", "text": "short"})
        history = chat.until("history")[-1]
        assert [(m["role"], m["content"]) for m in history["items"]] == [("user", "short")]
        chat.until("turn_end")
        sid = history["sessionId"]
    after = stored(chat_db)
    assert set(after) - set(before) == {sid} and after[sid] == 2


def test_a_refused_prompt_or_edit_in_a_conversation_stores_nothing(
    chat_server: LiveServer, chat_db: Path
) -> None:
    with ChatClient(chat_server.base) as chat:
        chat.send({"type": "set_sampling", "max_tokens": 2})
        turn = chat.turn({"type": "prompt", "text": "first"})
        sid = turn["frames"][0]["sessionId"]
        chat.until("sessions")  # the list after the answer
        kept = stored(chat_db)[sid]
        assert kept == 2
        for frame in (
            {"type": "prompt", "text": TOO_LONG},
            {"type": "edit_resend", "text": TOO_LONG},  # it would have dropped the answer
        ):
            frames = refused(chat, frame)
            assert [f["type"] for f in frames] == ["error", "turn_end"]
            assert frames[0]["code"] == "context_length_exceeded"
            assert stored(chat_db)[sid] == kept
        chat.send({"type": "open_session", "id": sid})
        history = chat.until("history")[-1]
        assert [m["content"] for m in history["items"]][0] == "first"
        assert len(history["items"]) == 2

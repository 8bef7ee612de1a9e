"""``/ws/chat`` without a browser: the frame protocol on a live server.

Every server frame is checked against the document (``ChatSocketServerFrame``).
Turns run on the tiny random model (whose text is newlines: only frames and
token counts are asserted), through the same turn pipeline as chat completions.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from fixtures.tool_models import build_tool_model
from mlxspec.config import ServeConfig
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.handlers.webchat.sessions import ChatStore
from mlxspec.http.app import create_app
from mlxspec.http.ws_chat import CLOSE_UNAUTHORIZED
from tests.conftest import LiveServer
from tests.fakes import FakeEngine
from tests.webchat_client import ChatClient, stats, wait_for, ws_url

KEY = "sekret"


@pytest.fixture(scope="module")
def chat_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chat") / "chat.sqlite3"


@pytest.fixture(scope="module")
def chat_server(tiny_engine: Any, chat_db: Path) -> Iterator[LiveServer]:
    app = create_app(tiny_engine, ServeConfig(chat_db=str(chat_db)), validate_responses=True)
    with LiveServer(app) as server:
        yield server


def short(client: ChatClient, tokens: int = 6) -> None:
    """Keep the session's answers short (the tiny model would fill its window)."""
    client.send({"type": "set_sampling", "max_tokens": tokens})


def test_a_plain_get_is_426(chat_server: LiveServer) -> None:
    with checking_client(chat_server.base) as c:
        r = c.get("/ws/chat")
    assert r.status_code == 426
    assert r.headers["upgrade"] == "websocket"
    assert r.json()["error"]["code"] == "upgrade_required"


def test_a_socket_is_greeted(chat_server: LiveServer) -> None:
    with ChatClient(chat_server.base) as chat:
        assert [f["type"] for f in chat.seen] == ["ready", "sessions", "history", "context"]
        ready = chat.greeting["ready"]
        assert ready["model"] == "tiny-llama"
        assert ready["contextWindow"] == 256 and ready["vision"] is False
        assert ready["transcription"] is False  # no Whisper checkpoint: no microphone
        assert chat.greeting["history"]["sessionId"] is None
        assert chat.greeting["context"]["tokens"] == 0


def test_a_prompt_streams_and_is_stored(chat_server: LiveServer) -> None:
    with ChatClient(chat_server.base) as chat:
        short(chat, 5)
        turn = chat.turn({"type": "prompt", "text": "hello there"})
        kinds = [f["type"] for f in turn["frames"]]
        assert kinds[:3] == ["history", "sessions", "turn_start"]
        assert kinds.count("text_delta") >= 1 and kinds[-2:] == ["turn_end", "context"]
        start = next(f for f in turn["frames"] if f["type"] == "turn_start")
        assert start["sampling"]["max_tokens"] == 5
        end = turn["end"]
        assert end["finishReason"] == "length" and end["lane"] == "batched"
        assert end["usage"]["completion_tokens"] == 5 and end["usage"]["lane"] == "batched"
        assert end["stats"]["ttftMs"] > 0
        usage = end["usage"]
        assert turn["context"]["tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        sid = start["sessionId"]
    with ChatClient(chat_server.base) as other:  # a second browser sees it
        listed = {s["id"]: s for s in other.greeting["sessions"]["items"]}
        assert listed[sid]["title"] == "hello there" and listed[sid]["messages"] == 2
        other.send({"type": "open_session", "id": sid})
        history = other.until("history")[-1]
        user, answer = history["items"]
        assert (user["role"], user["content"]) == ("user", "hello there")
        assert user["entryId"].startswith("e-") and "siblings" not in user
        assert answer["content"] == turn["text"] and answer["meta"]["lane"] == "batched"
        assert history["settings"]["sampling"] == {"max_tokens": 5}


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        ("not json", "invalid JSON frame"),
        ("[1, 2]", "Invalid type for frame: expected an object, but got an array instead."),
        ("{}", "type is required"),
        ('{"type": "nope"}', "unknown frame type: expected one of auth, prompt"),
        ('{"type": "context"}', "context is required"),
        ('{"type": "switch_sibling"}', "entryId is required"),
        ('{"type": "open_session"}', "open_session.path is required (a session's id)"),
        ('{"type": "open_session", "path": 7}', "Invalid type for 'path': expected a string"),
        ('{"type": "prompt"}', "prompt.text must be a non-empty string"),
        ('{"type": "set_sampling", "temperature": -1}', "Invalid value for 'temperature'"),
        ('{"type": "open_session", "id": 7}', "Invalid type for 'id': expected a string"),
        ('{"type": "open_session", "id": "chat-none"}', "no chat session 'chat-none'"),
        ('{"type": "regenerate"}', "this chat has no messages yet"),
        (
            '{"type": "prompt", "text": "x", "images": [{"data": "", "mimeType": "image/png"}]}',
            "model tiny-llama takes no images",
        ),
    ],
)
def test_a_malformed_frame_is_an_error_frame_and_the_socket_stays_open(
    chat_server: LiveServer, frame: str, message: str
) -> None:
    with ChatClient(chat_server.base) as chat:
        chat.send(frame)
        error = chat.until("error")[-1]
        assert error["message"].startswith(message), error
        chat.send({"type": "list_sessions"})
        assert chat.until("sessions")[-1]["type"] == "sessions"


def test_a_binary_frame_is_refused(chat_server: LiveServer) -> None:
    with ChatClient(chat_server.base) as chat:
        chat.ws.send(b"\x00\x01")
        assert chat.until("error")[-1]["message"] == "frames are JSON text messages, not binary"


def _first_delta(chat: ChatClient) -> dict[str, Any]:
    frames = chat.until("text_delta")
    return next(f for f in frames if f["type"] == "turn_start")


def test_abort_stops_the_turn_and_the_engine_request(chat_server: LiveServer) -> None:
    before = stats(chat_server.base)["requests"]["cancelled"]
    with ChatClient(chat_server.base) as chat:
        short(chat, 220)
        chat.send({"type": "prompt", "text": "a long answer please"})
        sid = _first_delta(chat)["sessionId"]
        chat.send({"type": "abort"})
        end = chat.until("turn_end")[-1]
        assert end["finishReason"] == "aborted" and "lane" not in end
        wait_for(lambda: stats(chat_server.base)["requests"]["cancelled"] == before + 1)
        wait_for(lambda: stats(chat_server.base)["admission"]["in_flight"] == 0)
        chat.until("context")
        chat.send({"type": "open_session", "id": sid})
        answer = chat.until("history")[-1]["items"][-1]
        assert answer["role"] == "assistant" and answer["meta"]["finishReason"] == "aborted"
        # the socket goes on: the next turn runs
        short(chat, 3)
        assert chat.turn({"type": "regenerate"})["end"]["usage"]["completion_tokens"] == 3


def test_a_socket_closed_mid_turn_frees_the_slot_and_keeps_the_partial_answer(
    chat_server: LiveServer,
) -> None:
    before = stats(chat_server.base)["requests"]["cancelled"]
    chat = ChatClient(chat_server.base)
    short(chat, 220)
    chat.send({"type": "prompt", "text": "leaving soon"})
    sid = _first_delta(chat)["sessionId"]
    chat.ws.close()
    wait_for(lambda: stats(chat_server.base)["requests"]["cancelled"] == before + 1)
    wait_for(lambda: stats(chat_server.base)["admission"]["in_flight"] == 0)

    def stored() -> Any:
        with ChatClient(chat_server.base) as again:
            again.send({"type": "open_session", "id": sid})
            items = again.until("history")[-1]["items"]
        return len(items) == 2 and items

    items = wait_for(stored)
    assert items[1]["meta"]["finishReason"] == "aborted"


def test_while_a_turn_runs_regenerate_is_refused_a_prompt_queued_and_leaving_stops_it(
    chat_server: LiveServer,
) -> None:
    with ChatClient(chat_server.base) as chat:
        short(chat, 220)
        chat.send({"type": "prompt", "text": "first"})
        _first_delta(chat)
        chat.send({"type": "regenerate"})
        frames = chat.until("error")
        assert frames[-1]["message"] == "a turn is running: abort it first"
        chat.send({"type": "prompt", "text": "second"})  # queued, not refused
        assert chat.until("queue_update")[-1]["followUp"] == ["second"]
        chat.send({"type": "new_session"})  # stops the turn, keeps its answer, drops the queue
        frames = chat.until("history")
        assert {"type": "queue_update", "steering": [], "followUp": []} in frames
        assert any(f["type"] == "turn_end" and f["finishReason"] == "aborted" for f in frames)
        assert frames[-1]["sessionId"] is None and frames[-1]["items"] == []


def test_regenerate_edit_fork_and_delete(chat_server: LiveServer) -> None:
    with ChatClient(chat_server.base) as chat:
        short(chat, 3)
        first = chat.turn({"type": "prompt", "text": "question one"})
        sid = first["frames"][0]["sessionId"]
        again = chat.turn({"type": "regenerate"})
        history = next(f for f in again["frames"] if f["type"] == "history")
        assert [m["role"] for m in history["items"]] == ["user"]  # the old answer: a branch
        edited = chat.turn({"type": "edit_resend", "text": "question two"})
        history = next(f for f in edited["frames"] if f["type"] == "history")
        assert [(m["role"], m["content"]) for m in history["items"]] == [("user", "question two")]
        chat.send({"type": "list_sessions"})
        listed = {s["id"]: s for s in chat.until("sessions")[-1]["items"]}
        assert listed[sid]["messages"] == 2
        chat.send({"type": "fork_session", "id": sid})
        fork = chat.until("history")[-1]
        assert fork["sessionId"] != sid and len(fork["items"]) == 2
        assert fork["items"][0]["content"] == "question two"
        chat.send({"type": "delete_session", "id": fork["sessionId"]})
        gone = chat.first("sessions", lambda f: f["activeId"] is None)
        assert fork["sessionId"] not in {s["id"] for s in gone["items"]}
        chat.send({"type": "delete_session", "id": fork["sessionId"]})
        error = chat.first("error")
        assert error["message"] == f"no chat session {fork['sessionId']!r}"


def test_session_frames_take_the_references_path_and_the_old_id(
    chat_server: LiveServer,
) -> None:
    with ChatClient(chat_server.base) as chat:
        short(chat, 2)
        sid = chat.turn({"type": "prompt", "text": "by path"})["frames"][0]["sessionId"]
        listed = chat.first("sessions", lambda f: f["activePath"] == sid)
        assert listed["activeId"] == sid
        item = next(i for i in listed["items"] if i["id"] == sid)
        assert item["path"] == sid
        chat.send({"type": "fork_session", "path": sid})
        fork = chat.until("history")[-1]["sessionId"]
        assert fork != sid and chat.until("sessions")[-1]["activePath"] == fork
        chat.send({"type": "open_session", "path": sid})
        assert chat.until("history")[-1]["sessionId"] == sid
        assert chat.until("sessions")[-1]["activePath"] == sid
        chat.send({"type": "delete_session", "path": fork})
        gone = chat.until("sessions")[-1]
        assert fork not in {s["path"] for s in gone["items"]}
        chat.send({"type": "delete_session", "path": fork})
        error = chat.until("error")[-1]
        assert error["message"] == f"no chat session {fork!r}" and error["param"] == "path"


def test_a_turn_sent_the_moment_turn_end_arrives_is_taken(
    chat_server: LiveServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The page's Regenerate may follow turn_end at once: by then the answer is
    stored and the socket free (it was refused while a slow disk still wrote
    the answer)."""
    append = ChatStore.append

    def slow_append(self: ChatStore, *args: Any) -> Any:
        time.sleep(0.3)  # a slow fsync: the answer's write outlasts a frame's trip
        return append(self, *args)

    monkeypatch.setattr(ChatStore, "append", slow_append)
    with ChatClient(chat_server.base) as chat:
        short(chat, 3)
        chat.send({"type": "prompt", "text": "quick"})
        sid = chat.until("turn_end")[0]["sessionId"]
        for _ in range(3):
            chat.send({"type": "regenerate"})  # before this turn's context frame
            frames = chat.until("turn_end")
            assert not [f for f in frames if f["type"] == "error"], frames
            history = next(f for f in frames if f["type"] == "history")
            assert [m["role"] for m in history["items"]] == ["user"]
        chat.until("context")
        chat.send({"type": "open_session", "id": sid})
        items = chat.until("history")[-1]["items"]
        assert [m["role"] for m in items] == ["user", "assistant"]
        assert items[1]["meta"]["finishReason"] == "length"


def test_settings_reach_the_engine_request(chat_server: LiveServer) -> None:
    with ChatClient(chat_server.base) as chat:
        chat.send({"type": "set_system_prompt", "text": "Be brief."})
        chat.send(
            {
                "type": "set_sampling",
                "temperature": 0.7,
                "top_p": 0.9,
                "top_k": 40,
                "min_p": 0.05,
                "max_tokens": 4,
                "seed": 11,
            }
        )
        chat.send({"type": "set_sampling", "scope": "next_turn", "max_tokens": 2})
        turn = chat.turn({"type": "prompt", "text": "hi"})
        start = next(f for f in turn["frames"] if f["type"] == "turn_start")
        assert start["sampling"] == {
            "temperature": 0.7,
            "top_p": 0.9,
            "top_k": 40,
            "min_p": 0.05,
            "max_tokens": 2,
            "seed": 11,
        }
        assert turn["end"]["usage"]["completion_tokens"] == 2
        # next_turn was for one turn; null returns a field to the server's default
        chat.send({"type": "set_sampling", "temperature": None})
        turn = chat.turn({"type": "regenerate"})
        start = next(f for f in turn["frames"] if f["type"] == "turn_start")
        assert start["sampling"]["max_tokens"] == 4 and start["sampling"]["temperature"] == 0.0
        history = next(f for f in turn["frames"] if f["type"] == "history")
        assert history["settings"]["systemPrompt"] == "Be brief."
        assert "temperature" not in history["settings"]["sampling"]


def test_another_socket_follows_the_list(chat_server: LiveServer) -> None:
    with ChatClient(chat_server.base) as watcher, ChatClient(chat_server.base) as chat:
        short(chat, 2)
        turn = chat.turn({"type": "prompt", "text": "watch this"})
        sid = turn["frames"][0]["sessionId"]
        watcher.first("sessions", lambda f: sid in {s["id"] for s in f["items"]})


def test_sessions_survive_a_restart(
    tiny_engine: Any, chat_db: Path, chat_server: LiveServer
) -> None:
    with ChatClient(chat_server.base) as chat:
        short(chat, 2)
        sid = chat.turn({"type": "prompt", "text": "remember me"})["frames"][0]["sessionId"]
    app = create_app(tiny_engine, ServeConfig(chat_db=str(chat_db)))
    with LiveServer(app) as restarted, ChatClient(restarted.base) as chat:
        assert sid in {s["id"] for s in chat.greeting["sessions"]["items"]}


# ------------------------------------------------------------------ handshake


def test_a_foreign_origin_is_refused(chat_server: LiveServer) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(chat_server.base), origin="https://evil.example", open_timeout=10)
    response = refused.value.response
    assert response.status_code == 403
    body = json.loads(response.body)
    assert body["error"]["code"] == "origin_not_allowed"
    assert "https://evil.example" in body["error"]["message"]
    with ChatClient(chat_server.base, origin=chat_server.base) as chat:  # its own page
        assert chat.greeting["ready"]["model"] == "tiny-llama"


def test_a_rebound_name_is_not_the_servers_own_origin(chat_server: LiveServer) -> None:
    # DNS rebinding: the page's own name, pointed at 127.0.0.1 (Host and Origin agree)
    sock = socket.create_connection(("127.0.0.1", chat_server.port))
    url = f"ws://evil.example:{chat_server.port}/ws/chat"
    with pytest.raises(InvalidStatus) as refused:
        connect(url, sock=sock, origin=f"http://evil.example:{chat_server.port}", open_timeout=10)
    assert refused.value.response.status_code == 403
    assert json.loads(refused.value.response.body)["error"]["code"] == "host_not_allowed"


def test_an_open_socket_outlives_the_header_and_keep_alive_timeouts(
    tiny_engine: Any, tmp_path: Path
) -> None:
    # mlxspec serve's connection limits bound a request's head, not an upgraded socket
    config = ServeConfig(chat_db=str(tmp_path / "db"), header_timeout=1, keep_alive_timeout=1)
    with LiveServer(create_app(tiny_engine, config), config) as server:
        with ChatClient(server.base) as chat:
            time.sleep(2.5)
            chat.send({"type": "list_sessions"})
            assert chat.first("sessions")["items"] == []


def test_allowed_origins_let_a_page_in(tiny_engine: Any, tmp_path: Path) -> None:
    config = ServeConfig(chat_db=str(tmp_path / "db"), allowed_origins=("https://app.example",))
    with LiveServer(create_app(tiny_engine, config)) as server:
        with ChatClient(server.base, origin="https://app.example") as chat:
            assert chat.greeting["ready"]["model"] == "tiny-llama"


def test_a_keyed_server_asks_for_the_key(tiny_engine: Any, tmp_path: Path) -> None:
    config = ServeConfig(chat_db=str(tmp_path / "db"), api_key=KEY)
    with LiveServer(create_app(tiny_engine, config)) as server:
        with ChatClient(server.base, greet=False) as chat:
            assert chat.recv()["type"] == "auth_required"
            chat.send({"type": "auth", "key": "wrong"})
            error = chat.recv()
            assert (error["message"], error["code"]) == ("invalid API key", "invalid_api_key")
            with pytest.raises(ConnectionClosed) as closed:
                chat.recv()
            assert closed.value.rcvd.code == CLOSE_UNAUTHORIZED
        with ChatClient(server.base, greet=False) as chat:
            assert chat.recv()["type"] == "auth_required"
            chat.send({"type": "auth", "key": KEY})
            assert chat.recv()["type"] == "ready"
        bearer = {"Authorization": f"Bearer {KEY}"}
        with ChatClient(server.base, additional_headers=bearer) as chat:  # no auth frame
            assert chat.seen[0]["type"] == "ready"
        with pytest.raises(InvalidStatus) as refused:
            connect(ws_url(server.base), additional_headers={"x-api-key": "no"}, open_timeout=10)
        assert refused.value.response.status_code == 401
        assert httpx.get(f"{server.base}/").status_code == 200  # the shell is public


def test_a_server_with_a_transcriber_says_so_in_ready(tiny_engine: Any, tmp_path: Path) -> None:
    """The page shows its microphone on ``ready.transcription``; the weights load
    at the first session, so a checkpoint that names no files is enough here."""
    from mlxspec.engine.audio import WhisperCheckpoint, WhisperService

    whisper = WhisperService(WhisperCheckpoint("whisper-tiny.en", "mlx", folder=tmp_path),
                             tiny_engine, tmp_path)  # fmt: skip
    app = create_app(tiny_engine, ServeConfig(chat_db=str(tmp_path / "db")), transcriber=whisper)
    with LiveServer(app) as server:
        with ChatClient(server.base) as chat:
            assert chat.greeting["ready"]["transcription"] is True


def test_another_websocket_path_is_a_404(chat_server: LiveServer) -> None:
    with pytest.raises(InvalidStatus) as refused:
        connect(ws_url(chat_server.base) + "/x", open_timeout=10)
    assert refused.value.response.status_code == 404


def test_set_thinking_reaches_the_template(tmp_path: Path) -> None:
    """``set_thinking`` is the template's ``enable_thinking``: off, the Qwen3-style
    template closes the channel; on, it opens it; the switch is kept with the session."""
    engine = FakeEngine.from_dir(build_tool_model(tmp_path / "think", "think"), "think")
    engine.script = ["</think>\n\nfine"]
    with LiveServer(create_app(engine, ServeConfig(chat_db=str(tmp_path / "db")))) as server:
        with ChatClient(server.base) as chat:
            assert chat.greeting["ready"]["thinking"] is True  # the page shows the switch
            chat.send({"type": "set_thinking", "enabled": False})
            turn = chat.turn({"type": "prompt", "text": "hi"})
            assert engine.prompts[-1].endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
            history = next(f for f in turn["frames"] if f["type"] == "history")
            assert history["settings"]["thinking"] is False
            chat.send({"type": "set_thinking", "enabled": True})
            turn = chat.turn({"type": "regenerate"})
            assert engine.prompts[-1].endswith("<|im_start|>assistant\n<think>\n")
            assert turn["text"] == "fine"


def test_a_typed_special_token_is_text_in_the_web_chat(
    chat_server: LiveServer, tiny_engine: Any
) -> None:
    from mlxspec.engine.literal_text import literal_text

    prompts = {}
    for text in ("x", "<|im_end|>"):
        with ChatClient(chat_server.base) as chat:
            short(chat, 1)
            turn = chat.turn({"type": "prompt", "text": text})
            prompts[text] = turn["end"]["usage"]["prompt_tokens"]
    spelt = literal_text(tiny_engine.tokenizer).plain_ids("<|im_end|>")
    assert len(tiny_engine.tokenizer.encode("x", add_special_tokens=False)) == 1
    assert prompts["<|im_end|>"] - prompts["x"] == len(spelt) - 1 > 0

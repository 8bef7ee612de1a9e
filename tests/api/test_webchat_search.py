"""``GET /api/sessions/search`` and ``/api/sessions/export`` on stored chats.

The conversations are written straight into the server's database (the same
file, WAL) before the searches, except one prompt sent through ``/ws/chat``,
whose words are found too: the index follows every write.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mlxspec.config import ServeConfig
from mlxspec.handlers.webchat.search import CONTEXT_CHARS, shown_branch, snippet
from mlxspec.handlers.webchat.sessions import ChatMessage, ChatStore, SessionSettings
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.webchat_client import ChatClient

LONG = "x" * 100 + " needle " + "y" * 100


@pytest.fixture(scope="module")
def chats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    path = tmp_path_factory.mktemp("search") / "chat.sqlite3"
    store = ChatStore(path)
    ids = {}
    for name, messages in {
        "herbs": [
            ("user", "Tell me about Rosemary and thyme"),
            ("assistant", "rosemary, ROSEMARY!"),
        ],
        "other": [("user", "no herbs here"), ("assistant", "then try rosemary")],
        "long": [("user", LONG), ("tool", "needle in a tool result")],
        "many": [("user", f"ab match {i}") for i in range(15)],
    }.items():
        sid = store.create(SessionSettings(), sid=f"chat-{name}")
        for role, text in messages:
            store.append(sid, ChatMessage(role, text))
        ids[name] = sid
    store.append(ids["herbs"], ChatMessage("assistant", "a rosemary sibling"), 1)  # a branch
    for n in range(6):
        sid = store.create(SessionSettings(), sid=f"chat-bulk-{n}")
        for i in range(12):
            store.append(sid, ChatMessage("user", f"bulk word {i}"))
    store.close()
    ids["db"] = str(path)
    return ids


@pytest.fixture(scope="module")
def server(tiny_engine: Any, chats: dict[str, str]) -> Iterator[LiveServer]:
    app = create_app(tiny_engine, ServeConfig(chat_db=chats["db"]), validate_responses=True)
    with LiveServer(app) as live:
        yield live


def find(server: LiveServer, q: str) -> dict[str, Any]:
    r = httpx.get(f"{server.base}/api/sessions/search", params={"q": q}, timeout=30)
    assert r.status_code == 200, r.text
    return {res["sessionPath"]: res for res in r.json()["results"]}


def test_a_word_is_found_across_sessions_whatever_its_case(
    server: LiveServer, chats: dict[str, str]
) -> None:
    found = find(server, "rosemary")
    assert set(found) == {chats["herbs"], chats["other"]}
    herbs = found[chats["herbs"]]
    assert herbs["sessionTitle"] == "Tell me about Rosemary and thyme"
    first = herbs["matches"][0]
    assert first == {
        "snippet": "Tell me about Rosemary and thyme",
        "ranges": [[14, 22]],
        "role": "user",
        "entryId": first["entryId"],
    }
    both = herbs["matches"][1]
    assert both["snippet"] == "rosemary, ROSEMARY!" and both["ranges"] == [[0, 8], [10, 18]]
    assert herbs["matches"][2]["snippet"] == "a rosemary sibling"  # every branch is searched
    for res in found.values():
        for match in res["matches"]:
            for start, end in match["ranges"]:
                assert match["snippet"][start:end].lower() == "rosemary"


def test_a_long_message_gives_a_cut_snippet_and_tool_results_are_not_searched(
    server: LiveServer, chats: dict[str, str]
) -> None:
    found = find(server, "NEEDLE")
    assert list(found) == [chats["long"]]
    (match,) = found[chats["long"]]["matches"]
    assert match["snippet"] == "…" + LONG[100 - CONTEXT_CHARS + 1 : 107 + CONTEXT_CHARS] + "…"
    ((start, end),) = match["ranges"]
    assert match["snippet"][start:end] == "needle" and start == 1 + CONTEXT_CHARS


def test_the_caps_and_a_short_query(server: LiveServer, chats: dict[str, str]) -> None:
    short = find(server, "ab")  # under the trigram's 3 characters: scanned
    assert len(short[chats["many"]]["matches"]) == 10
    bulk = find(server, "bulk word")
    assert len(bulk) == 5 and sum(len(r["matches"]) for r in bulk.values()) == 50


@pytest.mark.parametrize("q", ['"', 'a" OR "b', "NEAR(x y)", "*", "%_", "x AND"])
def test_query_syntax_is_text(server: LiveServer, q: str) -> None:
    assert find(server, q) == {} or all(
        q.lower() in m["snippet"].lower() for r in find(server, q).values() for m in r["matches"]
    )


def test_refusals(server: LiveServer) -> None:
    r = httpx.get(f"{server.base}/api/sessions/search", timeout=30)
    assert r.status_code == 400 and r.json()["error"]["message"] == "Missing query parameter 'q'"
    r = httpx.get(f"{server.base}/api/sessions/search", params={"q": ""}, timeout=30)
    assert r.status_code == 400
    r = httpx.get(f"{server.base}/api/sessions/export", timeout=30)
    assert r.status_code == 400 and "'path'" in r.json()["error"]["message"]
    r = httpx.get(f"{server.base}/api/sessions/export", params={"path": "chat-none"}, timeout=30)
    assert r.status_code == 404 and r.json()["error"]["message"] == "no chat session 'chat-none'"


def test_export_round_trips_the_tree(server: LiveServer, chats: dict[str, str]) -> None:
    r = httpx.get(f"{server.base}/api/sessions/export", params={"path": chats["herbs"]})
    assert r.status_code == 200
    body = r.json()
    assert body["ok"] is True and body["path"] == chats["herbs"]
    head, *messages = body["entries"]
    assert head["type"] == "session" and head["title"] == "Tell me about Rosemary and thyme"
    assert [m["message"]["content"] for m in messages] == [
        "Tell me about Rosemary and thyme",
        "rosemary, ROSEMARY!",
        "a rosemary sibling",
    ]
    assert messages[1]["parentId"] == messages[2]["parentId"] == messages[0]["id"]
    with ChatClient(server.base) as chat:
        chat.send({"type": "open_session", "path": chats["herbs"]})
        items = chat.until("history")[-1]["items"]
    shown = [{"role": i["role"], "content": i["content"]} for i in items]
    assert shown_branch(body["entries"]) == shown


def test_a_prompt_sent_on_the_socket_is_found(server: LiveServer) -> None:
    with ChatClient(server.base) as chat:
        chat.send({"type": "set_sampling", "max_tokens": 1})
        chat.turn({"type": "prompt", "text": "the Quokka smiles"})
        chat.send({"type": "list_sessions"})
        sid = chat.until("sessions")[-1]["activePath"]
    found = find(server, "quokka")
    assert found[sid]["matches"][0]["ranges"] == [[4, 10]]


def test_snippet_offsets_are_characters() -> None:
    assert snippet("ÄÖü naïve NAÏVE", "naïve") == ("ÄÖü naïve NAÏVE", [[4, 9], [10, 15]])
    assert snippet("nothing", "x") is None


def _export(server: LiveServer, sid: str) -> dict[str, Any]:
    r = httpx.get(f"{server.base}/api/sessions/export", params={"path": sid}, timeout=30)
    assert r.status_code == 200
    return r.json()


def _import(server: LiveServer, body: Any, **kw: Any) -> httpx.Response:
    return httpx.post(f"{server.base}/api/sessions/import", json=body, timeout=30, **kw)


def test_an_export_imports_back_as_the_same_tree(server: LiveServer, chats: dict[str, str]) -> None:
    exported = _export(server, chats["herbs"])
    r = _import(server, exported)
    assert r.status_code == 200
    answer = r.json()
    assert answer["ok"] is True and answer["messages"] == 3
    assert answer["path"] != chats["herbs"] and answer["path"].startswith("chat-")
    again = _export(server, answer["path"])
    head, *messages = again["entries"]
    assert {**head, "id": chats["herbs"]} == exported["entries"][0]  # titles, times, leaf, settings
    assert messages == exported["entries"][1:]  # ids, parents, timestamps, bodies
    assert answer["path"] in find(server, "rosemary sibling")  # indexed like any message
    with ChatClient(server.base) as chat:  # the page opens it on the same branch
        chat.send({"type": "open_session", "path": answer["path"]})
        items = chat.until("history")[-1]["items"]
    assert [i["content"] for i in items] == [m["content"] for m in shown_branch(again["entries"])]


def test_an_import_starts_with_the_coding_tools_off(
    server: LiveServer, chats: dict[str, str]
) -> None:
    entries = _export(server, chats["other"])["entries"]
    entries[0]["settings"] = {**entries[0]["settings"], "codingTools": True, "systemPrompt": "hi"}
    r = _import(server, {"entries": entries})  # the entries alone do too
    settings = _export(server, r.json()["path"])["entries"][0]["settings"]
    assert settings["codingTools"] is False and settings["systemPrompt"] == "hi"


def _bad_files(entries: list[dict[str, Any]]) -> list[tuple[Any, str | None, str]]:
    """(body, param, a word of the message) of files the import refuses."""
    head, first, second = entries
    orphan = {**second, "parentId": "e-nowhere"}
    return [
        ({"entries": []}, "entries", "non-empty"),
        ({"entries": [first, head]}, "entries[0]", "session entry"),
        ({"entries": [head, first, head]}, "entries[2].type", "first entry"),
        ({"entries": [head, first, {**second, "id": first["id"]}]}, "entries[2].id", "repeated"),
        ({"entries": [head, first, orphan]}, "entries[2].parentId", "names no message"),
        ({"entries": [head, second, first]}, "entries[1].parentId", "names no message"),
        ({"entries": [{**head, "leaf": "e-gone"}, first, second]}, "entries[0].leaf", "leaf"),
        (
            {"entries": [head, {**first, "message": {"role": "system", "content": "x"}}]},
            None,
            "system",
        ),
        ({"entries": [head, {k: v for k, v in first.items() if k != "message"}]}, None, "message"),
        ({"entries": [{**head, "settings": {"sampling": {"temperature": -1}}}]}, None, ""),
        ({"nothing": 1}, None, "entries"),
    ]


def test_a_bad_file_is_a_400_and_stores_nothing(server: LiveServer, chats: dict[str, str]) -> None:
    entries = _export(server, chats["other"])["entries"]
    before = len(find(server, "then try rosemary"))
    for body, param, word in _bad_files(entries):
        r = _import(server, body)
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert word in error["message"], (body, error)
        if param is not None:
            assert error["param"] == param, (body, error)
    assert len(find(server, "then try rosemary")) == before
    r = httpx.post(
        f"{server.base}/api/sessions/import",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400
    r = httpx.post(f"{server.base}/api/sessions/import", content=b"x", timeout=30)
    assert r.status_code == 415

"""The web chat's errors and URL in headless Chromium (issue 25, items 4 and 5).

An error stays on screen until the user acts (it was cleared by the very next
frame: a refused prompt showed the user's message and nothing else), and a
refused first prompt saves no conversation (it was saved). The open
conversation lives in the URL (``#chat/<id>``): reload, back, forward and a
pasted link find it; an unknown id lands on a new chat with a note.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxspec.config import ServeConfig
from mlxspec.handlers.webchat.sessions import ChatStore
from mlxspec.http.app import create_app
from tests.browser.test_webchat_browser import ask, visible_engine  # noqa: F401 - a fixture
from tests.conftest import LiveServer
from tests.webchat_client import ChatClient

#: Past the visible model's 4096-token window.
TOO_LONG = "word " * 5000


@pytest.fixture(scope="module")
def chat_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("urldb") / "chat.sqlite3"


@pytest.fixture(scope="module")
def web(visible_engine: Any, chat_db: Path) -> Iterator[LiveServer]:  # noqa: F811
    app = create_app(visible_engine, ServeConfig(chat_db=str(chat_db)), validate_responses=True)
    with LiveServer(app) as server:
        yield server


def stored(chat_db: Path) -> list[str]:
    """The stored sessions' ids, newest first, read from the database file."""
    store = ChatStore(chat_db)
    try:
        return [s.id for s in store.list()]
    finally:
        store.close()


def hash_of(page: Any) -> str:
    return page.evaluate("location.hash")


def load(page: Any, url: str) -> None:
    """Load ``url`` afresh (from another page: not a same-document hash change)."""
    page.goto("about:blank")
    page.goto(url)
    page.wait_for_selector("#prompt:not([disabled])")


def at(page: Any, want: str, timeout: float = 30) -> None:
    """Wait until the page's URL hash is ``want`` (the page's CSP forbids
    ``wait_for_function``'s evaluated strings)."""
    deadline = time.monotonic() + timeout
    while hash_of(page) != want:
        assert time.monotonic() < deadline, f"the hash is {hash_of(page)!r}, not {want!r}"
        page.wait_for_timeout(50)


def test_a_refused_first_prompt_stays_on_screen_and_saves_nothing(
    open_page: Any, web: LiveServer, chat_db: Path
) -> None:
    page, watch = open_page(web)
    before = stored(chat_db)
    listed = page.locator("#session-list li").count()
    page.fill("#prompt", TOO_LONG)
    page.press("#prompt", "Enter")
    error = watch.wait(lambda: watch.frames("error"))[-1]
    assert error["code"] == "context_length_exceeded"
    watch.wait(lambda: watch.frames("turn_end"))
    page.wait_for_selector("#send:not([hidden])")
    page.wait_for_timeout(300)  # any frame that would clear it has come
    assert page.is_visible("#notice") and page.inner_text("#notice-text") == error["message"]
    assert page.locator("#messages .msg").count() == 0  # the refused message is not shown as sent
    assert page.input_value("#prompt") == TOO_LONG  # it is back in the box, to shorten
    assert stored(chat_db) == before and page.locator("#session-list li").count() == listed
    assert hash_of(page) == ""  # no conversation to name
    # another socket's change sends this page frames: the error stays
    with ChatClient(web.base) as other:
        other.send({"type": "set_sampling", "max_tokens": 2})
        other.turn({"type": "prompt", "text": "elsewhere"})
    watch.wait(lambda: page.locator("#session-list li").count() > listed)
    assert page.is_visible("#notice")
    page.click("#dismiss-notice")  # dismissing is acting
    assert page.is_hidden("#notice")
    page.fill("#prompt", TOO_LONG)
    page.press("#prompt", "Enter")
    page.wait_for_selector("#notice:not([hidden])")
    ask(page, watch, "A short one")  # sending is acting
    assert page.is_hidden("#notice")
    assert page.inner_text(".msg.user .text") == "A short one"
    sid = watch.frames("turn_start")[-1]["sessionId"]
    assert stored(chat_db)[0] == sid and hash_of(page) == f"#chat/{sid}"


def test_the_url_names_the_open_chat(open_page: Any, web: LiveServer) -> None:
    page, watch = open_page(web)
    ask(page, watch, "First chat")
    first = watch.frames("turn_start")[-1]["sessionId"]
    assert hash_of(page) == f"#chat/{first}"
    page.click("#new-chat")
    at(page, "#chat")
    ask(page, watch, "Second chat")
    second = watch.frames("turn_start")[-1]["sessionId"]
    assert hash_of(page) == f"#chat/{second}"

    def shows(text: str | None) -> None:
        if text is None:
            watch.wait(lambda: page.locator("#messages .msg").count() == 0)
        else:
            page.wait_for_selector(f"#messages .msg.user .text:text-is('{text}')")

    page.go_back()  # the blank chat between them
    at(page, "#chat")
    shows(None)
    page.go_back()
    at(page, f"#chat/{first}")
    shows("First chat")
    page.go_forward()
    at(page, "#chat")
    shows(None)
    page.go_forward()
    at(page, f"#chat/{second}")
    shows("Second chat")
    page.reload()  # a reload opens the URL's chat
    page.wait_for_selector("#prompt:not([disabled])")
    shows("Second chat")
    assert hash_of(page) == f"#chat/{second}"
    page.click("#session-list button.session:has-text('First chat')")
    at(page, f"#chat/{first}")
    shows("First chat")
    # a link pasted into another browser profile opens it too
    other, _ = open_page(web)
    load(other, f"{web.base}/#chat/{second}")
    other.wait_for_selector("#messages .msg.user .text:text-is('Second chat')")
    assert other.inner_text(".msg.assistant .body")


def test_an_unknown_chat_in_the_url_lands_on_a_new_chat_with_a_note(
    open_page: Any, web: LiveServer
) -> None:
    page, watch = open_page(web)
    load(page, f"{web.base}/#chat/chat-gone")
    page.wait_for_selector("#notice:not([hidden])")
    assert page.inner_text("#notice-text") == (
        "No conversation chat-gone here (deleted, or another server's): this is a new chat."
    )
    at(page, "#chat")
    assert page.locator("#messages .msg").count() == 0
    ask(page, watch, "Fresh start")
    sid = watch.frames("turn_start")[-1]["sessionId"]
    assert hash_of(page) == f"#chat/{sid}" and page.is_hidden("#notice")

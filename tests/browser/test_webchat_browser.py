"""The web chat in a real browser: headless Chromium (Debian's ``chromium``)
driven by Playwright for Python, against live servers.

Turns run on a tiny random model whose answers are visible characters
(:func:`~fixtures.tiny_chat_model.build_visible_llama`); rendering (Markdown,
code, thinking, tool calls, injected HTML) is checked on the scripted
:class:`~tests.fakes.FakeEngine` with a real chat template. Every test also
checks that the page loaded nothing from another origin and threw no error.
With ``MLXSPEC_SCREENSHOTS=DIR`` the main states are saved there as PNGs (the
README's come from ``docs/``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.tiny_chat_model import build_visible_llama
from fixtures.tool_models import build_tool_model
from mlxspec.config import ServeConfig
from mlxspec.http.app import create_app
from tests.browser.harness import Watch
from tests.conftest import LiveServer
from tests.fakes import FakeEngine
from tests.webchat_client import stats, wait_for

KEY = "browser-key"
#: A scripted answer: thinking (the template opened it), Markdown, code, HTML and
#: links a model must not be able to turn into markup, and a tool call.
SCRIPT = [
    "The user wants the weather; ",
    "I have a tool for that.</think>\n\n",
    "## Weather in Paris\n\nI will call **get_weather** with `city`:\n\n",
    "```python\ndef get_weather(city: str) -> dict:\n    return {'city': city}\n```\n\n",
    '<img src=x onerror="window.pwned=1"><script>window.pwned=1</script>\n\n',
    "[a link](javascript:window.pwned=1) and ![beacon](http://tracker.example/x.png)\n\n",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def visible_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from mlxspec.engine import Engine, GenerationDefaults

    folder = build_visible_llama(tmp_path_factory.mktemp("visible") / "model")
    # like `mlxspec serve --max-tokens 40`: answers of under a second here
    engine = Engine.load(folder, "tiny-chat", overrides=GenerationDefaults(max_tokens=40))
    engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def web(visible_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    db = tmp_path_factory.mktemp("webdb") / "chat.sqlite3"
    app = create_app(visible_engine, ServeConfig(chat_db=str(db)), validate_responses=True)
    with LiveServer(app) as server:
        yield server


def ask(page: Any, watch: Watch, text: str) -> dict[str, Any]:
    """Type ``text``, press Enter, wait for the answer; returns its ``turn_end``."""
    ended = watch.turns_ended()
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    watch.wait(lambda: watch.turns_ended() > ended)
    page.wait_for_selector("#send:not([hidden])")
    return watch.frames("turn_end")[-1]


def shoot(page: Any, name: str, tmp_path: Path) -> None:
    """A screenshot, into ``$MLXSPEC_SCREENSHOTS`` when set."""
    folder = Path(os.environ.get("MLXSPEC_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / f"{name}.png"))


def test_a_message_streams_into_the_page(open_page: Any, web: LiveServer) -> None:
    page, watch = open_page(web)
    assert page.inner_text("#model-name") == "tiny-chat"
    assert page.inner_text("#model-context") == "context 4,096"  # from /fit
    # every text the streaming answer shows, as the page paints it
    page.evaluate(
        """() => {
          window.painted = [];
          new MutationObserver(() => {
            const body = document.querySelector(".msg.assistant.live .body");
            if (body) window.painted.push(body.textContent.replace("▍", ""));
          }).observe(document.querySelector("#messages"), {subtree: true, childList: true});
        }"""
    )
    page.click("#open-settings")  # an answer long enough to watch it grow (~1 s)
    page.fill("#setting-max_tokens", "300")
    page.click("#settings-save")
    end = ask(page, watch, "Hello there")
    deltas = "".join(f["delta"] for f in watch.frames("text_delta"))
    assert len(watch.frames("text_delta")) > 1 and deltas.strip()
    painted = [text.strip() for text in page.evaluate("window.painted") if text.strip()]
    # it was on screen before it was whole: a paint showed a part of the answer
    # (how many paints depends on the machine's load: the page paints once a frame)
    assert painted and any(len(text) < len(deltas.strip()) for text in painted), painted
    assert all(deltas.startswith(text) for text in painted)
    assert page.inner_text(".msg.assistant .body") == deltas
    assert page.inner_text("#stat-lane") == "batched"
    assert page.inner_text("#stat-cached") == str(end["stats"]["cachedTokens"])
    assert page.inner_text("#stat-tps").endswith("tok/s")
    assert page.inner_text("#stat-ttft").endswith("ms")
    assert page.inner_text("#stat-context").endswith(
        f"/ 4096 tokens ({watch.frames('context')[-1]['percent']:g}%)"  # as JS prints 8.0
    )
    assert page.inner_text("#session-list .session .title") == "Hello there"
    assert "300 tokens · cut at max tokens" in page.inner_text(".msg.assistant .meta")


def test_stop_mid_answer_cancels_the_request(open_page: Any, web: LiveServer) -> None:
    page, watch = open_page(web)
    page.click("#open-settings")
    page.fill("#setting-max_tokens", "3000")
    page.fill("#setting-temperature", "0.5")
    page.click("#settings-save")
    sampling = watch.wait(lambda: watch.frames("set_sampling", watch.sent))[-1]
    assert (sampling["max_tokens"], sampling["temperature"]) == (3000, 0.5)
    assert page.inner_text("#settings-summary") == "temperature 0.5, max_tokens 3000"
    before = stats(web.base)["requests"]["cancelled"]
    page.fill("#prompt", "Tell me everything")
    page.press("#prompt", "Enter")
    start = watch.wait(lambda: watch.frames("turn_start"))[-1]
    assert (start["sampling"]["max_tokens"], start["sampling"]["temperature"]) == (3000, 0.5)
    live = page.wait_for_selector(".msg.assistant.live .body")
    watch.wait(lambda: live.inner_text().strip("▍ \n"))
    page.click("#stop")
    end = watch.wait(lambda: watch.frames("turn_end"))[-1]
    assert end["finishReason"] == "aborted"
    assert "stopped" in page.inner_text(".msg.assistant .meta")
    wait_for(lambda: stats(web.base)["requests"]["cancelled"] == before + 1)
    wait_for(lambda: stats(web.base)["admission"]["in_flight"] == 0)
    assert page.is_visible("#send") and not page.is_visible("#stop")


def test_reload_and_a_second_browser_find_the_conversation(open_page: Any, web: LiveServer) -> None:
    page, watch = open_page(web)
    ask(page, watch, "Please persist me")
    answer = page.inner_text(".msg.assistant .body")
    page.reload()
    page.wait_for_selector("#prompt:not([disabled])")
    page.click("#session-list button.session:has-text('Please persist me')")
    page.wait_for_selector(".msg.assistant .body")
    assert page.inner_text(".msg.user .text") == "Please persist me"
    assert page.inner_text(".msg.assistant .body") == answer
    other, _ = open_page(web)  # another browser profile: nothing shared but the server
    other.click("#session-list button.session:has-text('Please persist me')")
    other.wait_for_selector(".msg.assistant .body")
    assert other.inner_text(".msg.assistant .body") == answer


def test_regenerate_and_edit_and_resend(open_page: Any, web: LiveServer) -> None:
    page, watch = open_page(web)
    ask(page, watch, "First question")
    ended = watch.turns_ended()
    page.click(".msg.assistant button:has-text('Regenerate')")
    watch.wait(lambda: watch.turns_ended() > ended)
    page.wait_for_selector(".msg.assistant:not(.live) button:has-text('Regenerate')")
    assert page.locator(".msg").count() == 2
    assert watch.frames("regenerate", watch.sent)
    page.click(".msg.user button:has-text('Edit')")
    page.fill(".msg.user textarea.edit-box", "Second question")
    ended = watch.turns_ended()
    page.press(".msg.user textarea.edit-box", "Enter")
    watch.wait(lambda: watch.turns_ended() > ended)
    page.wait_for_selector(".msg.user .text:has-text('Second question')")
    assert page.locator(".msg").count() == 2
    assert watch.frames("edit_resend", watch.sent)[-1]["text"] == "Second question"
    # the title follows the first message, edited
    assert page.inner_text("#session-list li.active .title") == "Second question"


def test_keyboard_only(open_page: Any, web: LiveServer) -> None:
    page, watch = open_page(web)
    keys = page.keyboard
    assert page.evaluate("document.activeElement.id") == "prompt"
    keys.type("line one")
    keys.press("Shift+Enter")  # a newline, not a send
    keys.type("line two")
    assert page.input_value("#prompt") == "line one\nline two"
    assert not watch.frames("prompt", watch.sent)
    ended = watch.turns_ended()
    keys.press("Enter")
    watch.wait(lambda: watch.turns_ended() > ended)
    assert watch.frames("prompt", watch.sent)[-1]["text"] == "line one\nline two"
    keys.press("Control+Shift+O")  # a new chat
    watch.wait(lambda: page.locator(".msg").count() == 0)
    for _ in range(60):  # Tab to the conversation, then open it with Enter
        keys.press("Tab")
        if page.evaluate("document.activeElement.classList.contains('session')"):
            if "line one" in page.evaluate("document.activeElement.textContent"):
                break
    else:
        raise AssertionError("Tab never reached the conversation")
    keys.press("Enter")
    page.wait_for_selector(".msg.user .text:has-text('line two')")
    page.focus("#prompt")
    keys.type("again")
    ended = watch.turns_ended()
    keys.press("Enter")
    keys.press("Escape")  # Esc stops the answer
    watch.wait(lambda: watch.turns_ended() > ended)
    assert watch.frames("abort", watch.sent)
    assert watch.frames("turn_end")[-1]["finishReason"] in ("aborted", "length")


def test_phone_width(open_page: Any, web: LiveServer, tmp_path: Path) -> None:
    page, watch = open_page(web, viewport={"width": 390, "height": 844}, is_mobile=True)
    ask(page, watch, "On a phone")
    assert page.is_visible("#toggle-sidebar")
    page.wait_for_timeout(300)  # the drawer's slide
    assert page.locator("#sidebar").bounding_box()["x"] < 0  # off screen
    page.click("#toggle-sidebar")
    page.wait_for_timeout(300)
    assert page.locator("#sidebar").bounding_box()["x"] == 0
    page.click("#session-list button.session:has-text('On a phone')")
    page.wait_for_timeout(300)
    assert page.locator("#sidebar").bounding_box()["x"] < 0
    width = page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, "nothing overflows the screen's width"


def test_the_status_view(open_page: Any, web: LiveServer) -> None:
    page, _ = open_page(web)
    page.goto(web.base + "/status")  # the legacy path, redirected to /#status
    page.wait_for_selector("#status-table th:has-text('Requests')")
    assert page.url.endswith("/#status") and not page.is_visible("#chat-view")
    page.click("#status-view a[href='#chat']")
    page.wait_for_selector("#chat-view", state="visible")


@pytest.fixture(scope="module")
def keyed(visible_engine: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    db = tmp_path_factory.mktemp("keydb") / "chat.sqlite3"
    app = create_app(visible_engine, ServeConfig(chat_db=str(db), api_key=KEY))
    with LiveServer(app) as server:
        yield server


def test_a_keyed_server_asks_for_the_key_once(browser: Any, keyed: LiveServer) -> None:
    ctx = browser.new_context()
    try:
        page = ctx.new_page()
        watch = Watch(page, keyed.base)
        page.goto(keyed.base + "/")
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#api-key", "wrong")
        page.press("#api-key", "Enter")
        page.wait_for_selector("#key-dialog[open] #key-message:has-text('not accepted')")
        page.fill("#api-key", KEY)
        page.press("#api-key", "Enter")
        page.wait_for_selector("#prompt:not([disabled])")
        assert page.inner_text("#model-name") == "tiny-chat"
        page.reload()
        page.wait_for_selector("#prompt:not([disabled])")
        assert not page.is_visible("#key-dialog")
        assert [f["key"] for f in watch.sent if f["type"] == "auth"] == ["wrong", KEY, KEY]
        assert not watch.errors and not watch.foreign
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def scripted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, LiveServer]]:
    engine = FakeEngine.from_dir(
        build_tool_model(tmp_path_factory.mktemp("think"), "think"), "demo"
    )
    engine.script, engine.delay = SCRIPT, 0.01
    db = tmp_path_factory.mktemp("scripteddb") / "chat.sqlite3"
    with LiveServer(create_app(engine, ServeConfig(chat_db=str(db)))) as server:
        yield engine, server


def test_markdown_code_thinking_and_tool_calls_render_safely(
    open_page: Any, scripted: tuple[Any, LiveServer], tmp_path: Path
) -> None:
    engine, server = scripted
    page, watch = open_page(server)
    page.click("#open-settings")
    page.fill("#tools", json.dumps(TOOLS))
    page.fill("#system-prompt", "You are a weather assistant.")
    page.click("#settings-save")
    ask(page, watch, "What is the weather in Paris?")
    assert engine.requests[-1].prompt  # it ran through the turn pipeline with the tools
    assert "get_weather" in engine.prompts[-1] and "weather assistant" in engine.prompts[-1]
    answer = page.locator(".msg.assistant")
    assert answer.locator("details.reasoning").get_attribute("open") is None  # folded
    assert "I have a tool for that" in answer.locator("details.reasoning").text_content()
    assert answer.locator(".body h2").inner_text() == "Weather in Paris"
    assert answer.locator(".body strong").inner_text() == "get_weather"
    assert answer.locator(".body pre code.hljs span[class^='hljs-']").count() > 0
    # the model's HTML is text, its javascript: link is no link, its image not loaded
    assert "<script>" in answer.locator(".body").inner_text()
    assert answer.locator("img, script, [onerror]").count() == 0
    assert page.evaluate("window.pwned") is None
    assert answer.locator("a[href^='javascript']").count() == 0
    assert answer.locator("a[href='http://tracker.example/x.png']").count() == 1
    tool = answer.locator(".tool-call")
    assert "Tool call: get_weather" in tool.inner_text() and "not run" in tool.inner_text()
    assert json.loads(tool.locator("code").inner_text()) == {"city": "Paris"}
    assert watch.frames("tool_end")[-1]["ok"] is False
    assert watch.frames("thinking_delta")
    answer.locator("details.reasoning summary").click()  # unfolds
    assert answer.locator("details.reasoning").get_attribute("open") == ""
    shoot(page, "webchat-desktop", tmp_path)
    page.click("#open-settings")
    shoot(page, "webchat-settings", tmp_path)
    page.keyboard.press("Escape")
    page.set_viewport_size({"width": 390, "height": 844})
    page.wait_for_timeout(300)
    shoot(page, "webchat-phone", tmp_path)

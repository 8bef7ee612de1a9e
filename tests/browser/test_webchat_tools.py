"""The coding tools' approval card and a branched answer in headless Chromium.

A scripted model (:class:`tests.fakes.FakeEngine` on the Hermes tool fixture)
asks to ``write`` a file, then to run ``bash``: the page shows an approval card
for each; the user denies the first and allows the second, whose output appears
on its card. Then an answer is regenerated twice and the page steps back to the
first version (``< 1/3 >``), which a reload keeps; the sessions panel's search
finds that chat; the model moves the page and spotlights a button (the app-aware
tools). The card, the branched answer and the search results are
photographed into ``docs/`` (``MLXSPEC_SCREENSHOTS=1`` rewrites the
committed pictures).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.tool_models import build_tool_model
from mlxspec.config import ServeConfig
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.fakes import FakeEngine

DOCS = Path(__file__).resolve().parents[2] / "docs"
SHOT = DOCS / "webchat-approval-card.png"
BRANCH_SHOT = DOCS / "webchat-branches.png"
SEARCH_SHOT = DOCS / "webchat-search.png"


def call(name: str, **args: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


@pytest.fixture(scope="module")
def tools_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LiveServer, Path, list[str]]]:
    model = build_tool_model(tmp_path_factory.mktemp("agent") / "hermes", "hermes")
    engine = FakeEngine.from_dir(model, "agent")
    replies = [
        call("write", path="plan.md", content="# plan"),
        call("bash", command="echo hi"),
        "done",
    ]
    answers = iter(range(1, 100))
    engine.script = lambda request: [replies.pop(0) if replies else f"answer {next(answers)}"]
    workspace = tmp_path_factory.mktemp("ws")
    config = ServeConfig(
        chat_db=str(tmp_path_factory.mktemp("db") / "c.sqlite3"), web_tools=str(workspace)
    )
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLXSPEC_CONFIG_DIR", str(tmp_path_factory.mktemp("config")))
        with LiveServer(create_app(engine, config)) as server:
            yield server, workspace, replies


def test_the_approval_card_denies_and_allows(open_page: Any, tools_server: Any) -> None:
    server, workspace, _ = tools_server
    page, watch = open_page(server)
    chip = page.locator("#coding-tools")
    chip.click()
    watch.wait(lambda: page.get_attribute("#coding-tools", "aria-pressed") == "true")
    page.fill("#prompt", "write a plan, then say hi")
    page.keyboard.press("Enter")
    card = page.locator(".tool-call .approval").first
    card.wait_for()
    assert "Run write?" in card.inner_text()
    if os.environ.get("MLXSPEC_SCREENSHOTS") == "1" or not SHOT.exists():
        page.locator(".msg.assistant.live").screenshot(path=str(SHOT))
    card.locator("button.deny").click()
    page.locator(".tool-call .badge.failed").first.wait_for()
    allow = page.locator(".tool-call .approval button.approve")
    allow.wait_for()
    allow.click()
    watch.wait(lambda: watch.turns_ended() == 1)
    assert [f["decision"] for f in watch.frames("approval", watch.sent)] == ["deny", "allow"]
    assert not (workspace / "plan.md").exists()
    # the turn's stored history is shown again: both calls' results on their cards
    page.locator(".tool-call .badge.ok").wait_for()
    outputs = page.locator(".tool-output").all_inner_texts()
    assert outputs[0].startswith("denied") and outputs[1] == "hi\n"
    assert page.locator(".msg.assistant .body").last.inner_text().strip() == "done"


def test_regenerated_answers_are_versions_that_outlive_a_reload(
    open_page: Any, tools_server: Any
) -> None:
    server, _, _ = tools_server
    page, watch = open_page(server)
    page.fill("#prompt", "pick a number")
    page.keyboard.press("Enter")
    watch.wait(lambda: watch.turns_ended() == 1)
    last = page.locator(".msg.assistant").last
    first = last.locator(".body").inner_text().strip()
    for n in (2, 3):
        last.get_by_role("button", name="Regenerate").click()
        page.locator(f".msg.assistant .siblings .where:text('{n}/{n}')").wait_for()
        last = page.locator(".msg.assistant").last
    third = last.locator(".body").inner_text().strip()
    assert third != first
    last.get_by_role("button", name="Previous version").click()
    page.locator(".msg.assistant .siblings .where:text('2/3')").wait_for()
    page.locator(".msg.assistant").last.get_by_role("button", name="Previous version").click()
    page.locator(".msg.assistant .siblings .where:text('1/3')").wait_for()
    assert page.locator(".msg.assistant .body").last.inner_text().strip() == first
    if os.environ.get("MLXSPEC_SCREENSHOTS") == "1" or not BRANCH_SHOT.exists():
        page.locator(".msg").last.screenshot(path=str(BRANCH_SHOT))
    page.reload()
    page.locator(".msg.assistant .siblings .where:text('1/3')").wait_for()
    assert page.locator(".msg.assistant .body").last.inner_text().strip() == first


def test_the_search_box_finds_a_word_and_opens_its_chat(open_page: Any, tools_server: Any) -> None:
    server, _, _ = tools_server
    page, watch = open_page(server)
    page.fill("#session-search", "NUMBER")
    result = page.locator("#search-results button.match").first
    result.wait_for()
    assert page.locator("#search-results mark").first.inner_text() == "number"
    assert result.inner_text() == "You: pick a number"
    assert page.locator("#session-list").is_hidden()
    if os.environ.get("MLXSPEC_SCREENSHOTS") == "1" or not SEARCH_SHOT.exists():
        page.locator("#sidebar").screenshot(path=str(SEARCH_SHOT))
    result.click()
    watch.wait(lambda: watch.frames("open_session", watch.sent))
    page.locator(".msg.user .text:text('pick a number')").wait_for()


def test_search_ranges_count_code_points_as_the_server_does(
    open_page: Any, tools_server: Any
) -> None:
    """The server's ranges index Python's code points: after an emoji (two UTF-16
    units in the page) the mark still covers the word, not half a surrogate pair."""
    server, _, _ = tools_server
    page, _ = open_page(server)
    marks = page.evaluate(
        r"""async () => {
            const { markedSnippet } = await import("/assets/search.js");
            const text = "emoji \u{1F600}\u{1F600} then café CAFÉ";
            const node = markedSnippet(text, [[9, 13], [14, 18], [19, 23]]);
            const marks = [...node.querySelectorAll("mark")].map((m) => m.textContent);
            return marks.concat(node.textContent);
        }"""
    )
    assert marks == ["then", "café", "CAFÉ", "emoji \U0001F600\U0001F600 then café CAFÉ"]


def test_the_model_navigates_the_page_and_spotlights_a_button(
    open_page: Any, tools_server: Any
) -> None:
    server, _, replies = tools_server
    page, watch = open_page(server)
    page.locator("#coding-tools").click()
    watch.wait(lambda: page.get_attribute("#coding-tools", "aria-pressed") == "true")
    sent = watch.wait(lambda: watch.frames("context", watch.sent))[-1]["context"]
    assert sent["route"] == "chat"
    labels = {e["label"] for e in sent["snapshot"]["elements"]}
    assert {"New chat", "Search all conversations"} <= labels
    replies.clear()  # whatever earlier tests left unused
    replies.extend(
        [
            call("navigate_app", route="status"),
            call("spotlight_ui", target="new-chat", message="Start here"),
            "done",
        ]
    )
    page.fill("#prompt", "where do I start?")
    page.keyboard.press("Enter")
    watch.wait(lambda: watch.frames("ui_spotlight"))
    assert watch.frames("ui_navigate") == [{"type": "ui_navigate", "route": "status"}]
    watch.wait(lambda: page.evaluate("location.hash") == "#status")
    assert page.locator("#status-view").is_visible()
    page.locator("#new-chat.spotlight").wait_for()
    assert page.locator(".spotlight-tip").inner_text() == "Start here"
    watch.wait(lambda: watch.frames("context", watch.sent)[-1]["context"]["route"] == "status")

"""Fixtures of the browser tests: one Chromium per module (a module may add
launch flags through ``chromium_args``) and fresh pages on a live server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.browser.harness import (
    CHROMIUM,
    CHROMIUM_ARGS,
    REQUIRED,
    Watch,
    missing_browser,
    sync_api,
)
from tests.conftest import LiveServer


@pytest.fixture(scope="module", autouse=True)
def a_browser() -> None:
    """Fail (CI) or skip (elsewhere) before any server starts when nothing can
    drive a browser."""
    if (why := missing_browser()) is not None:
        (pytest.fail if REQUIRED else pytest.skip)(why)


@pytest.fixture(scope="module")
def chromium_args() -> list[str]:
    """Flags beyond :data:`~tests.browser.harness.CHROMIUM_ARGS` (none here)."""
    return []


@pytest.fixture(scope="module")
def browser(chromium_args: list[str]) -> Iterator[Any]:
    with sync_api.sync_playwright() as playwright:
        args = CHROMIUM_ARGS + chromium_args
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=args)
        yield chromium
        chromium.close()


@pytest.fixture()
def open_page(browser: Any) -> Iterator[Callable[..., tuple[Any, Watch]]]:
    """Opens the chat of a server in a fresh browser context (a new browser
    profile); at the end, no page may have thrown or reached another origin."""
    contexts, watches = [], []

    def opener(server: LiveServer, **context: Any) -> tuple[Any, Watch]:
        ctx = browser.new_context(**{"viewport": {"width": 1280, "height": 800}, **context})
        contexts.append(ctx)
        page = ctx.new_page()
        page.on("dialog", lambda dialog: dialog.accept())
        watch = Watch(page, server.base)
        watches.append(watch)
        page.goto(server.base + "/")
        page.wait_for_selector("#prompt:not([disabled])")
        return page, watch

    yield opener
    for ctx in contexts:
        ctx.close()
    for watch in watches:
        assert not watch.errors, watch.errors
        assert not watch.foreign, watch.foreign

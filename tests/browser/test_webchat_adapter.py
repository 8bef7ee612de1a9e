"""The web chat's adapter chip in headless Chromium.

The server holds an API key (so the chip's ``/v1/adapters`` reads must carry the
page's key) and serves a tiny random Llama with a random adapter ``a`` mounted
before the page opens (``POST /v1/adapters``: Playwright's event loop runs in
this thread, so the test cannot run the engine's coroutines itself).
``MLXSPEC_ADAPTER_DIRS`` holds ``b``, a compatible adapter not mounted, and the
committed ``fixtures/adapters`` (``french``, ``signoff``: trained on SmolLM2, so
not compatible): both kinds are listed greyed out.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fixtures.random_adapters import make_random_adapter
from fixtures.tiny_model import build_tiny_llama
from mlxspec.config import ServeConfig
from mlxspec.http.app import create_app
from tests.browser.harness import Watch
from tests.conftest import LiveServer

KEY = "chip-key"
COMMITTED = Path(__file__).resolve().parents[2] / "fixtures" / "adapters"


@pytest.fixture(scope="module")
def adapter_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from mlxspec.engine import Engine, GenerationDefaults

    model = build_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny-llama")
    on_disk = tmp_path_factory.mktemp("on-disk")
    mounted = make_random_adapter(model, tmp_path_factory.mktemp("mounted") / "a", seed=1)
    make_random_adapter(model, on_disk / "b", seed=2)
    engine = Engine.load(model, "tiny-llama", overrides=GenerationDefaults(max_tokens=6))
    engine.start()
    db = tmp_path_factory.mktemp("chipdb") / "chat.sqlite3"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLXSPEC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        env.setenv("MLXSPEC_ADAPTER_DIRS", f"{on_disk}:{COMMITTED}")
        app = create_app(engine, ServeConfig(chat_db=str(db), api_key=KEY))
        with LiveServer(app) as server:
            r = httpx.post(
                f"{server.base}/v1/adapters",
                json={"id": "a", "path": str(mounted)},
                headers={"Authorization": f"Bearer {KEY}"},
            )
            assert r.status_code == 200, r.text
            yield server
    engine.close()


def menu(page: Any) -> dict[str, dict[str, Any]]:
    """The open menu's items: ``{label: {adapter, checked, greyed, title}}``."""
    return page.eval_on_selector_all(
        "#adapter-menu [role=menuitemradio]",
        """items => Object.fromEntries(items.map(b => [b.textContent, {
            adapter: b.dataset.adapter, checked: b.getAttribute("aria-checked") === "true",
            greyed: b.getAttribute("aria-disabled") === "true", title: b.title}]))""",
    )


def test_the_chip_lists_adapters_and_the_choice_reaches_the_next_turn(
    browser: Any, adapter_server: LiveServer
) -> None:
    ctx = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        page = ctx.new_page()
        watch = Watch(page, adapter_server.base)
        page.goto(adapter_server.base + "/")
        page.wait_for_selector("#key-dialog[open]")
        page.fill("#api-key", KEY)
        page.press("#api-key", "Enter")
        page.wait_for_selector("#prompt:not([disabled])")
        # shown only because /v1/adapters answered: the page sent its key
        page.wait_for_selector("#adapter-picker:not([hidden])")
        assert page.inner_text("#adapter-chip") == "adapter: base"

        page.click("#adapter-chip")
        page.wait_for_selector("#adapter-menu:not([hidden])")
        items = menu(page)
        assert list(items) == ["a", "b", "french", "signoff", "none (base model)"]
        assert not items["a"]["greyed"] and not items["none (base model)"]["greyed"]
        assert items["a"]["title"] == "rank 4, scale 8, 14 layers"
        assert items["b"]["greyed"] and items["b"]["title"].startswith("Not mounted. Mount it")
        assert items["french"]["greyed"] and items["french"]["title"] == (
            "Trained on SmolLM2-135M-Instruct, not on the served model: it cannot be mounted here."
        )
        # Playwright, like a screen reader, takes aria-disabled as disabled: force the click
        page.click("#adapter-menu [data-adapter=french]", force=True)  # greyed: nothing happens
        assert not page.is_hidden("#adapter-menu")
        page.click("#adapter-menu [data-adapter=a]")
        assert page.is_hidden("#adapter-menu")
        assert page.inner_text("#adapter-chip") == "adapter: a"
        watch.wait(lambda: watch.frames("set_adapter", watch.sent))
        assert watch.frames("set_adapter", watch.sent) == [{"type": "set_adapter", "id": "a"}]

        page.fill("#prompt", "hello")
        page.press("#prompt", "Enter")
        watch.wait(lambda: watch.turns_ended())
        assert watch.frames("turn_start")[-1]["adapter"] == "a"  # the engine request's

        page.reload()  # the session keeps it
        page.wait_for_selector("#prompt:not([disabled])")
        page.click("#session-list button.session")
        watch.wait(lambda: page.inner_text("#adapter-chip") == "adapter: a")
        page.click("#adapter-chip")
        page.wait_for_selector("#adapter-menu:not([hidden])")
        assert menu(page)["a"]["checked"]
        page.keyboard.press("Escape")
        assert page.is_hidden("#adapter-menu")
        assert not watch.errors and not watch.foreign
    finally:
        ctx.close()

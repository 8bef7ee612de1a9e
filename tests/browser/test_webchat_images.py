"""Images in the web chat's composer, in headless Chromium.

On a tiny random Qwen2.5-VL (``fixtures/tiny_vlm.py``) the composer shows its
image button (``ready.vision``): an image pasted into the message box, one
picked with the button and one dropped on the composer wait as thumbnails (one
removed again), go out as ``prompt.images``, reach the vision tower (the
encoder cache counts a miss), show in the transcript, are kept with the session
in SQLite and come back when the chat is opened again. On a text-only model the
button is hidden and a paste is refused with a notice. The conversation is
photographed into ``docs/webchat-images.png`` (``MLXSPEC_SCREENSHOTS=1``
rewrites it).
"""

from __future__ import annotations

import base64
import io
import json
import os
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fixtures.tiny_model import build_tiny_llama
from fixtures.tiny_vlm import build_tiny_vlm
from mlxspec.config import ServeConfig
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.fakes import FakeEngine

SHOT = Path(__file__).resolve().parents[2] / "docs" / "webchat-images.png"

#: Puts a File made of base64 ``bytes`` into a DataTransfer and fires ``kind`` on ``selector``.
FIRE = """([selector, kind, name, bytes]) => {
  const raw = Uint8Array.from(atob(bytes), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([raw], name, { type: "image/png" }));
  const target = document.querySelector(selector);
  const event = kind === "paste"
    ? new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true })
    : new DragEvent("drop", { dataTransfer: data, bubbles: true, cancelable: true });
  target.dispatchEvent(event);
}"""


def _png(seed: int, size: tuple[int, int] = (100, 80)) -> bytes:
    from PIL import Image

    rng = np.random.RandomState(seed)
    pixels = (rng.rand(size[1], size[0], 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def vision_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[LiveServer, Any, Path]]:
    from mlxspec.engine import Engine, GenerationDefaults

    folder = build_tiny_vlm(tmp_path_factory.mktemp("vlm") / "tiny-qwen-vl")
    engine = Engine.load(folder, "tiny-qwen-vl", overrides=GenerationDefaults(max_tokens=6))
    engine.start()
    db = tmp_path_factory.mktemp("db") / "chat.sqlite3"
    try:
        with LiveServer(create_app(engine, ServeConfig(chat_db=str(db)))) as server:
            yield server, engine, db
    finally:
        engine.close()


def test_pasted_picked_and_dropped_images_are_sent_shown_and_kept(
    open_page: Any, vision_server: Any, tmp_path: Path
) -> None:
    server, engine, db = vision_server
    page, watch = open_page(server)
    assert page.is_visible("#attach")  # ready.vision
    page.evaluate(FIRE, ["#prompt", "paste", "pasted.png", base64.b64encode(_png(1)).decode()])
    picked = tmp_path / "picked.png"
    picked.write_bytes(_png(2, (56, 56)))
    page.set_input_files("#attach-input", str(picked))
    page.evaluate(FIRE, ["#composer", "drop", "dropped.png", base64.b64encode(_png(3)).decode()])
    thumbs = page.locator("#attachments .attachment")
    watch.wait(lambda: thumbs.count() == 3)
    page.click("#attachments .attachment:nth-child(2) button")  # remove the picked one
    watch.wait(lambda: thumbs.count() == 2)
    misses = engine.vision.encoder_cache.stats()["object_misses"]
    page.fill("#prompt", "What is in these pictures?")
    page.keyboard.press("Enter")
    watch.wait(lambda: watch.turns_ended() == 1, timeout=120)
    assert page.locator("#attachments").is_hidden()  # sent: the tray is empty
    (prompt,) = watch.frames("prompt", watch.sent)
    sent = [base64.b64decode(i["data"]) for i in prompt["images"]]
    assert sent == [_png(1), _png(3)]
    assert {i["mimeType"] for i in prompt["images"]} == {"image/png"}
    end = watch.frames("turn_end")[-1]
    assert end["finishReason"] in {"stop", "length"}, end
    # the two images reached the vision tower (one request: one encoder-cache key)
    assert engine.vision.encoder_cache.stats()["object_misses"] == misses + 1
    user = page.locator(".msg.user").last
    watch.wait(lambda: user.locator(".images img").count() == 2)
    # kept with the session in SQLite, as the frame sent them
    with sqlite3.connect(db) as con:
        rows = con.execute("SELECT meta FROM messages WHERE role = 'user'").fetchall()
    assert [json.loads(meta)["images"] for (meta,) in rows] == [
        [{"data": i["data"], "mimeType": i["mimeType"]} for i in prompt["images"]]
    ]
    if os.environ.get("MLXSPEC_SCREENSHOTS") == "1" or not SHOT.exists():
        page.screenshot(path=str(SHOT))
    page.reload()  # the chat reopens from the store, images included
    page.wait_for_selector("#prompt:not([disabled])")
    user = page.locator(".msg.user").last
    watch.wait(lambda: user.locator(".images img").count() == 2)
    shown = user.locator(".images img").first.get_attribute("src")
    assert shown == f"data:image/png;base64,{prompt['images'][0]['data']}"


def test_a_text_model_hides_the_button_and_refuses_a_paste(
    open_page: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    model = build_tiny_llama(tmp_path_factory.mktemp("text") / "tiny-llama")
    engine = FakeEngine.from_dir(model, "text-only")
    config = ServeConfig(chat_db=str(tmp_path_factory.mktemp("db2") / "c.sqlite3"))
    with LiveServer(create_app(engine, config)) as server:
        page, watch = open_page(server)
        assert page.is_hidden("#attach")
        page.evaluate(FIRE, ["#prompt", "paste", "p.png", base64.b64encode(_png(4)).decode()])
        watch.wait(lambda: page.inner_text("#notice-text") == "This model takes no images.")
        assert page.locator("#attachments").is_hidden()

"""What the browser tests share: the system Chromium, whether it must be there,
and :class:`Watch` (what a page did)."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from typing import Any

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
#: CI must run these tests (.ci/run exports MLXSPEC_REQUIRE_BROWSER=1, CI services
#: set CI=true): there a missing browser or Playwright fails every test; elsewhere
#: it skips them, saying what to install.
CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
REQUIRED = CI or os.environ.get("MLXSPEC_REQUIRE_BROWSER") == "1"
#: root in a container: no sandbox; a small /dev/shm: use /tmp
CHROMIUM_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
try:
    from playwright import sync_api
except ImportError:  # the test extra was not installed
    sync_api = None


def missing_browser() -> str | None:
    """Why no browser can be driven here, or ``None``."""
    missing = []
    if CHROMIUM is None:
        missing.append("no chromium on PATH (apt-get install chromium; .ci/run does)")
    if sync_api is None:
        missing.append("no Playwright (pip install -e '.[test]')")
    return "; ".join(missing) or None


class Watch:
    """What a page did: socket frames both ways, uncaught errors, foreign requests."""

    def __init__(self, page: Any, base: str) -> None:
        self.page, self.base = page, base
        self.sent: list[dict[str, Any]] = []
        self.received: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.foreign: list[str] = []
        page.on("websocket", self._socket)
        page.on("pageerror", lambda error: self.errors.append(str(error)))
        page.on("request", self._request)

    def _socket(self, ws: Any) -> None:
        ws.on("framesent", lambda payload: self.sent.append(json.loads(payload)))
        ws.on("framereceived", lambda payload: self.received.append(json.loads(payload)))

    def _request(self, request: Any) -> None:
        url = request.url
        if not url.startswith((self.base + "/", self.base.replace("http", "ws") + "/", "data:")):
            self.foreign.append(url)

    def frames(self, kind: str, where: list[dict[str, Any]] | None = None) -> list[dict]:
        return [f for f in (self.received if where is None else where) if f["type"] == kind]

    def wait(self, test: Callable[[], Any], timeout: float = 30) -> Any:
        """Poll ``test`` while the page runs (Playwright delivers events during waits)."""
        deadline = time.monotonic() + timeout
        while not (value := test()):
            if time.monotonic() > deadline:
                raise AssertionError("the page did not get there in time")
            self.page.wait_for_timeout(50)
        return value

    def turns_ended(self) -> int:
        return len(self.frames("turn_end"))

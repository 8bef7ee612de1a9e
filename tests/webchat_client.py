"""A ``/ws/chat`` test client that checks every server frame against the document.

:class:`ChatClient` wraps a ``websockets`` synchronous connection: each frame
it receives must match ``components/schemas/ChatSocketServerFrame`` (as each
HTTP response the tests see must match its operation), and :meth:`until`
gathers frames up to the one a test waits for.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from jsonschema import Draft202012Validator
from websockets.sync.client import ClientConnection, connect

from mlxspec.handlers.webchat.frames import schema

SERVER_FRAME = Draft202012Validator(schema("ChatSocketServerFrame"))


def ws_url(base: str) -> str:
    """``ws://host:port/ws/chat`` for a server at ``base`` (``http://host:port``)."""
    return base.replace("http://", "ws://", 1) + "/ws/chat"


class ChatClient:
    """One socket to a live server's ``/ws/chat``.

    Args:
        base (str): the server root, ``http://127.0.0.1:<port>``.
        greet (bool): read the greeting (``ready``, ``sessions``, ``history``,
            ``context``) first. Default: ``True``.
        **options: passed to ``websockets.sync.client.connect`` (``origin``,
            ``additional_headers``).
    """

    def __init__(self, base: str, greet: bool = True, **options: Any) -> None:
        self.base = base
        self.ws: ClientConnection = connect(ws_url(base), open_timeout=10, **options).__enter__()
        self.seen: list[dict[str, Any]] = []
        self.greeting: dict[str, dict[str, Any]] = {}
        if greet:
            for frame in self.until("context"):
                self.greeting[frame["type"]] = frame

    def __enter__(self) -> ChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.ws.close()

    def send(self, frame: dict[str, Any] | str) -> None:
        """Send a frame (a dict as JSON, a string as it is)."""
        self.ws.send(frame if isinstance(frame, str) else json.dumps(frame))

    def recv(self, timeout: float = 30) -> dict[str, Any]:
        """The next frame, checked against the document."""
        frame = json.loads(self.ws.recv(timeout))
        SERVER_FRAME.validate(frame)
        self.seen.append(frame)
        return frame

    def until(self, kind: str, timeout: float = 60) -> list[dict[str, Any]]:
        """Frames up to and including the first of type ``kind``."""
        deadline, out = time.monotonic() + timeout, []
        while True:
            frame = self.recv(max(0.1, deadline - time.monotonic()))
            out.append(frame)
            if frame["type"] == kind:
                return out

    def first(self, kind: str, test: Any = None, timeout: float = 60) -> dict[str, Any]:
        """The next frame of type ``kind`` that ``test`` (a predicate) accepts."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self.until(kind, max(0.1, deadline - time.monotonic()))[-1]
            if test is None or test(frame):
                return frame

    def turn(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send a turn's frame and gather it: ``{"frames", "text", "end", "context"}``."""
        self.send(frame)
        frames = self.until("turn_end")
        frames += self.until("context")
        text = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
        end = next(f for f in frames if f["type"] == "turn_end")
        return {"frames": frames, "text": text, "end": end, "context": frames[-1]}


def stats(base: str) -> dict[str, Any]:
    """The server's ``/stats``."""
    return httpx.get(f"{base}/stats", timeout=30).json()


def wait_for(predicate: Any, timeout: float = 10) -> Any:
    """Poll ``predicate`` until it returns a true value; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.05)

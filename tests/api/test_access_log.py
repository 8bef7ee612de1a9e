"""The access log names the error of every 4xx/5xx (it said ``400 Bad Request``
only): :mod:`mlxspec.http.access_log` on the tiny live server, and the note of
each error envelope; exactly one line per request, 499 for a non-streamed one
whose client left mid-generation (it had none)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import httpx
import pytest

from mlxspec.http.access_log import ErrorNoteFilter, access_log_config, error_note
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.fakes import FakeEngine

#: Non-streamed requests of each generating surface (the scripted engine answers all).
LEAVING = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
    (
        "/v1/messages",
        {"model": "m", "max_tokens": 500, "messages": [{"role": "user", "content": "hi"}]},
    ),
]


class Lines(logging.Handler):
    """Keeps each access record's error note, as the access handler's filter sets
    it, and each record's path and status."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(ErrorNoteFilter())
        self.notes: list[tuple[int, str]] = []
        self.paths: list[tuple[str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.notes.append((int(record.args[-1]), record.error_note))  # type: ignore[index, attr-defined]
        self.paths.append((str(record.args[2]), int(record.args[-1])))  # type: ignore[index]


@pytest.fixture()
def access() -> Iterator[Lines]:
    logger = logging.getLogger("uvicorn.access")
    lines, level = Lines(), logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(lines)
    logger.setLevel(level)


@pytest.fixture(scope="module")
def slow(tiny_engine: object) -> Iterator[tuple[FakeEngine, LiveServer]]:
    """A live server on a scripted engine whose answers take 20 s (a token every 0.1 s)."""
    engine = FakeEngine(tiny_engine.tokenizer, tiny_engine.info, tiny_engine.defaults)  # type: ignore[attr-defined]
    engine.script = ["word "] * 200
    engine.delay = 0.1
    with LiveServer(create_app(engine)) as server:
        yield engine, server


def test_error_lines_carry_the_error(access: Lines, tiny_server: LiveServer) -> None:
    with httpx.Client(base_url=tiny_server.base, timeout=30) as c:
        c.get("/health")
        c.post("/v1/chat/completions", json={"messages": [{"role": "bot", "content": "x"}]})
        c.post("/v1/messages", json={"model": "m", "messages": []})
        c.get("/nowhere")
        c.get("/health", headers={"Host": "evil.test"})
    assert access.notes[0] == (200, "")
    status, note = access.notes[1]
    assert status == 400
    assert note == (
        " - invalid_request_error: role must be one of 'system', 'developer', 'user', "
        "'assistant', 'tool'"
    )
    assert access.notes[2] == (400, " - invalid_request_error: max_tokens is required")
    assert access.notes[3] == (404, " - not_found_error: not found")
    assert access.notes[4][0] == 403 and "Host 'evil.test' is not allowed" in access.notes[4][1]


@pytest.mark.parametrize(
    ("body", "note"),
    [
        (
            b'{"error": {"message": "a\\n  b", "type": "invalid_request_error"}}',
            "invalid_request_error: a b",
        ),
        (b'{"type": "error", "error": {"type": "api_error", "message": "m"}}', "api_error: m"),
        (b'{"detail": [{"loc": ["body"], "msg": "bad", "type": "x"}]}', "bad"),
        (b"Internal Server Error", ""),
        (b"[1]", ""),
        (b'{"error": "plain"}', ""),
    ],
)
def test_error_note_of_each_envelope(body: bytes, note: str) -> None:
    assert error_note(body) == note


def test_long_messages_are_cut() -> None:
    note = error_note(b'{"error": {"message": "' + b"x" * 1000 + b'", "type": "t"}}')
    assert len(note) == len("t: ") + 300 and note.endswith("...")


def test_the_access_format_ends_with_the_note() -> None:
    config = access_log_config()
    assert config["formatters"]["access"]["fmt"].endswith("%(status_code)s%(error_note)s")
    assert config["handlers"]["access"]["filters"] == ["error_note"]


@pytest.mark.parametrize(("path", "body"), LEAVING)
def test_a_client_that_leaves_a_plain_request_gets_one_499_line(
    access: Lines, slow: tuple[FakeEngine, LiveServer], path: str, body: dict
) -> None:
    """uvicorn drops the answer to a client that left, and its access line with
    it: the line is written anyway, once, with 499 (it was missing)."""
    _, server = slow
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.base + path, json=body, timeout=0.5)
    deadline = time.monotonic() + 10
    while not access.paths and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.3)  # a second line would come now
    assert access.paths == [(path, 499)]
    assert access.notes[0][1].startswith(" - the client left before the response")
    with httpx.Client(base_url=server.base, timeout=30) as c:  # the server still answers
        assert c.get("/health").status_code == 200
    assert access.paths[-1] == ("/health", 200) and len(access.paths) == 2


def test_a_stream_whose_client_leaves_keeps_its_one_200_line(
    access: Lines, slow: tuple[FakeEngine, LiveServer]
) -> None:
    _, server = slow
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
    with (
        httpx.Client(base_url=server.base, timeout=30) as c,
        c.stream("POST", "/v1/chat/completions", json=body) as r,
    ):
        next(r.iter_lines())
    time.sleep(0.5)
    assert access.paths == [("/v1/chat/completions", 200)]

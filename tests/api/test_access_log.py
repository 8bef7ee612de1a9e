"""The access log names the error of every 4xx/5xx (it said ``400 Bad Request``
only): :mod:`mlxspec.http.access_log` on the tiny live server, and the note of
each error envelope."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import httpx
import pytest

from mlxspec.http.access_log import ErrorNoteFilter, access_log_config, error_note
from tests.conftest import LiveServer


class Lines(logging.Handler):
    """Keeps each access record's error note, as the access handler's filter sets it."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(ErrorNoteFilter())
        self.notes: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.notes.append((int(record.args[-1]), record.error_note))  # type: ignore[index, attr-defined]


@pytest.fixture()
def access(tiny_server: LiveServer) -> Iterator[Lines]:
    logger = logging.getLogger("uvicorn.access")
    lines, level = Lines(), logger.level
    logger.addHandler(lines)
    logger.setLevel(logging.INFO)
    yield lines
    logger.removeHandler(lines)
    logger.setLevel(level)


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

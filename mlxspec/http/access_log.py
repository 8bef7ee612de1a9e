"""The access log names the error of every 4xx and 5xx answer.

uvicorn writes its access line when a response starts, from the status alone
(``"POST /v1/messages HTTP/1.1" 400 Bad Request``), which leaves an operator
guessing what was wrong. :class:`ErrorNotes` holds the start of an error
response until its body (one JSON envelope, :mod:`mlxspec.errors`) is sent and
puts the error's type and message in a context variable; the access handler's
:class:`ErrorNoteFilter` adds it to the line:

    INFO:     127.0.0.1:53736 - "POST /v1/messages HTTP/1.1" 400 Bad Request -
    invalid_request_error: Invalid value for 'messages[1].role': ...

The context variable is the request task's own, so concurrent requests never
see each other's notes. The edge's own refusals (408, 431, 503, framing 400s)
are logged by :mod:`.connections` with their message already.

Every request gets exactly one access line. uvicorn drops a response start sent
after the client left, and its line with it (a non-streamed answer whose client
disconnected mid-generation left no trace): :class:`ErrorNotes` sees that no
access record was made while the start was sent (:class:`AccessMark`, a filter on
the ``uvicorn.access`` logger) and writes the line itself with status 499 (nginx's
"client closed request", the error table's ``cancelled``); so does a request
that ends without any response after its client left.
"""

from __future__ import annotations

import contextvars
import copy
import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = [
    "AccessMark",
    "ErrorNoteFilter",
    "ErrorNotes",
    "access_log_config",
    "error_note",
    "install_access_mark",
]

#: The error of the response being sent in this request's task, if any.
_NOTE: contextvars.ContextVar[str] = contextvars.ContextVar("mlxspec_error_note", default="")
#: Access records made while this request's task sends its response start.
_MARKS: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar(
    "mlxspec_access_marks", default=None
)
#: The most characters of an error message the access line repeats.
NOTE_CHARS = 300
#: The status of the line written for a client that left (nginx's, the error table's).
CLIENT_LEFT = 499
ACCESS_LOGGER = "uvicorn.access"


def error_note(body: bytes) -> str:
    """``type: message`` of an error body in any of the server's envelopes
    (OpenAI's, Anthropic's, System One's ``detail`` list), on one line; ``""``
    for a body that is none of them.

    Args:
        body (bytes): the response body (or its first chunk).

    Returns:
        str: the note, at most :data:`NOTE_CHARS` characters of message.
    """
    try:
        data = json.loads(body)
    except ValueError:
        return ""
    if not isinstance(data, dict):
        return ""
    error, kind = data.get("error"), None
    if isinstance(error, dict):
        kind, message = error.get("type"), error.get("message")
    elif isinstance(data.get("detail"), list) and data["detail"]:
        first = data["detail"][0]
        message = first.get("msg") if isinstance(first, dict) else None
    else:
        return ""
    if not isinstance(message, str):
        return ""
    message = " ".join(message.split())
    if len(message) > NOTE_CHARS:
        message = message[: NOTE_CHARS - 3] + "..."
    return f"{kind}: {message}" if isinstance(kind, str) else message


class ErrorNotes:
    """ASGI middleware: an error response's start waits for its first body
    chunk, whose error becomes the access line's note (see the module).

    Args:
        app (ASGIApp): the application.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        install_access_mark()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        started = left = False

        async def watching() -> Message:
            nonlocal left
            message = await receive()
            left = left or message["type"] == "http.disconnect"
            return message

        async def start(message: Message, note: str) -> None:
            nonlocal started
            started, marks = True, []
            marked, noted = _MARKS.set(marks), _NOTE.set(note)
            try:
                await send(message)  # uvicorn writes the access line here, unless the client left
            finally:
                _MARKS.reset(marked)
                _NOTE.reset(noted)
            if not marks:
                _client_left(scope, note)

        async def noting(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start":
                if message["status"] >= 400:
                    held = message  # sent with the body, once the error is known
                else:
                    await start(message, "")
                return
            if held is not None:
                first, held = held, None
                await start(first, error_note(message.get("body", b"")))
            await send(message)

        try:
            await self.app(scope, watching, noting)
        finally:
            if held is not None:  # a start without a body: send it as it was
                await start(held, "")
            elif not started and left:  # no answer at all to a client that left
                _client_left(scope, "")


def _client_left(scope: Scope, note: str) -> None:
    """Write the access line uvicorn did not: the request's, with status 499."""
    from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

    left = "the client left before the response"
    token = _NOTE.set(f"{left} ({note})" if note else left)
    try:
        logging.getLogger(ACCESS_LOGGER).info(
            '%s - "%s %s HTTP/%s" %d',
            get_client_addr(scope),
            scope["method"],
            get_path_with_query_string(scope),
            scope["http_version"],
            CLIENT_LEFT,
        )
    finally:
        _NOTE.reset(token)


class AccessMark(logging.Filter):
    """On the ``uvicorn.access`` logger: counts the access records made while a
    response start is sent (:class:`ErrorNotes` writes the line when there were
    none). Installed once, by :func:`install_access_mark`."""

    def filter(self, record: logging.LogRecord) -> bool:
        marks = _MARKS.get()
        if marks is not None:
            marks.append(1)
        return True


def install_access_mark() -> None:
    """Put one :class:`AccessMark` on the ``uvicorn.access`` logger (idempotent;
    ``logging.config.dictConfig`` keeps a logger's filters)."""
    logger = logging.getLogger(ACCESS_LOGGER)
    if not any(isinstance(f, AccessMark) for f in logger.filters):
        logger.addFilter(AccessMark())


class ErrorNoteFilter(logging.Filter):
    """Sets ``record.error_note`` (``" - type: message"``, or ``""``) for the
    access formatter's ``%(error_note)s``."""

    def filter(self, record: logging.LogRecord) -> bool:
        note = _NOTE.get()
        record.error_note = f" - {note}" if note else ""
        return True


def access_log_config() -> dict[str, Any]:
    """uvicorn's logging configuration (``uvicorn.config.LOGGING_CONFIG``) with
    the error note on the access line."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    access = config["formatters"]["access"]
    access["fmt"] = access["fmt"] + "%(error_note)s"
    config.setdefault("filters", {})["error_note"] = {"()": ErrorNoteFilter}
    config["handlers"]["access"]["filters"] = ["error_note"]
    return config

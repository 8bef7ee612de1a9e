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
"""

from __future__ import annotations

import contextvars
import copy
import json
import logging
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ErrorNoteFilter", "ErrorNotes", "access_log_config", "error_note"]

#: The error of the response being sent in this request's task, if any.
_NOTE: contextvars.ContextVar[str] = contextvars.ContextVar("mlxspec_error_note", default="")
#: The most characters of an error message the access line repeats.
NOTE_CHARS = 300


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

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None

        async def noting(message: Message) -> None:
            nonlocal held
            if message["type"] == "http.response.start" and message["status"] >= 400:
                held = message  # sent with the body, once the error is known
                return
            if held is not None:
                start, held = held, None
                token = _NOTE.set(error_note(message.get("body", b"")))
                try:
                    await send(start)  # uvicorn writes the access line here
                finally:
                    _NOTE.reset(token)
            await send(message)

        await self.app(scope, receive, noting)
        if held is not None:  # a start without a body: send it as it was
            await send(held)


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

"""One error taxonomy for every surface, its mapping and its renderers.

Every failure a client can see is an :class:`ApiError` whose ``kind`` is a row
of :data:`ERROR_TABLE`; the row fixes the HTTP status and the envelope's
``type``/``code``. The same row renders an HTTP response, a Connexion
validation error and an in-band SSE error frame, so the three can never
disagree (the pattern of TGI's ``InferError``). Whatever a request raised
becomes its :class:`ApiError` in one place, :func:`from_exception` (an engine
request that ends without finishing: :func:`from_failure`), which every surface
calls: the app's error handlers, the SSE writer and the handlers' event reader.
Internal exceptions are never rendered with ``str(exc)``: they are logged and
become ``server_error`` with a fixed message.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException

log = logging.getLogger("mlxspec.errors")


@dataclass(frozen=True)
class ErrorSpec:
    """One row of the error table.

    Args:
        status (int): HTTP status code.
        type (str): the envelope's ``error.type``.
        code (str | None): the envelope's ``error.code``.
    """

    status: int
    type: str
    code: str | None = None


#: kind -> (status, OpenAI ``type``, ``code``). Rows follow the reference's
#: "Errors" sections (429 ``resource_admission``/``queue_full``; 400
#: ``memory_admission``/``context_over_budget``; 400 ``context_length_exceeded``
#: as OpenAI names it).
ERROR_TABLE: dict[str, ErrorSpec] = {
    "invalid_request": ErrorSpec(400, "invalid_request_error"),
    "invalid_json": ErrorSpec(400, "invalid_request_error", "invalid_json"),
    # HTTP framing the server cannot read (RFC 9112 sections 6.1-6.3): a non-numeric
    # or repeated Content-Length, Content-Length with chunked Transfer-Encoding.
    "malformed_request": ErrorSpec(400, "invalid_request_error", "malformed_request"),
    "context_length_exceeded": ErrorSpec(400, "invalid_request_error", "context_length_exceeded"),
    "context_over_budget": ErrorSpec(400, "memory_admission", "context_over_budget"),
    "unauthorized": ErrorSpec(401, "authentication_error", "invalid_api_key"),
    # A Host the server does not answer to (DNS rebinding; --allowed-hosts), an
    # /admin request or a /ws/chat handshake from a foreign Origin (--allowed-origins).
    "host_not_allowed": ErrorSpec(403, "permission_error", "host_not_allowed"),
    "origin_not_allowed": ErrorSpec(403, "permission_error", "origin_not_allowed"),
    # POST /v1/adapters naming a folder outside --adapter-dirs.
    "adapter_path_not_allowed": ErrorSpec(403, "permission_error", "adapter_path_not_allowed"),
    "not_found": ErrorSpec(404, "not_found_error"),
    # A stored Responses object that is unknown, expired or deleted (OpenAI
    # answers these as invalid requests with a 404).
    "response_not_found": ErrorSpec(404, "invalid_request_error", "response_not_found"),
    "method_not_allowed": ErrorSpec(405, "invalid_request_error", "method_not_allowed"),
    # A CORS preflight from an origin (or for a method) --allowed-origins refuses.
    "cors_refused": ErrorSpec(400, "invalid_request_error", "cors_refused"),
    # A body or header block that stopped arriving (RFC 9110 section 15.5.9).
    "request_timeout": ErrorSpec(408, "invalid_request_error", "request_timeout"),
    "payload_too_large": ErrorSpec(413, "invalid_request_error", "payload_too_large"),
    "unsupported_media_type": ErrorSpec(415, "invalid_request_error", "unsupported_media_type"),
    # A plain GET of a WebSocket route (/ws/chat; RFC 9110 section 15.5.22).
    "upgrade_required": ErrorSpec(426, "invalid_request_error", "upgrade_required"),
    "queue_full": ErrorSpec(429, "resource_admission", "queue_full"),
    # The request line and headers over --max-header-bytes (RFC 6585 section 5).
    "headers_too_large": ErrorSpec(431, "invalid_request_error", "request_headers_too_large"),
    # 499 (nginx's "client closed request"): the client left; never a 500.
    "cancelled": ErrorSpec(499, "request_cancelled", "request_cancelled"),
    "server_error": ErrorSpec(500, "server_error"),
    "unavailable": ErrorSpec(503, "server_error", "unavailable"),
    # A connection over --max-connections (uvicorn's limit_concurrency answers plain text).
    "too_many_connections": ErrorSpec(503, "server_error", "too_many_connections"),
    # Speech to text (reference "POST /v1/audio/transcriptions" and "Streaming
    # transcription sessions"): undecodable audio or a clip under 0.1 s is a 400,
    # a take over --max-audio-seconds a 413, no Whisper checkpoint (or no chat
    # model on a transcription-only server) a 503.
    "invalid_audio": ErrorSpec(400, "invalid_request_error", "invalid_audio"),
    "audio_too_long": ErrorSpec(413, "invalid_request_error", "audio_too_long"),
    "session_not_found": ErrorSpec(404, "not_found_error", "session_not_found"),
    "session_finished": ErrorSpec(409, "invalid_request_error", "session_finished"),
    "too_many_sessions": ErrorSpec(429, "resource_admission", "too_many_sessions"),
    "model_unavailable": ErrorSpec(503, "server_error", "model_unavailable"),
    # The supervisor (issue 29; reference, "Internal routes"): an --isolate child that
    # cannot be reached is a 502 whose type is engine_unavailable; a model naming
    # nothing served under --strict-model a 404 (OpenAI's model_not_found).
    "engine_unavailable": ErrorSpec(502, "engine_unavailable", "engine_unavailable"),
    # A model sharded over processes (issue 33) that lost one: the engine is there but
    # cannot run, so a 503 (retry elsewhere) with the reference's engine_unavailable type;
    # work a sharded engine does not run at all is a 400 of its own (not a validation
    # error, so /v1/systemone keeps the OpenAI envelope rather than a 422 detail).
    "group_unavailable": ErrorSpec(503, "engine_unavailable", "engine_unavailable"),
    "not_shardable": ErrorSpec(400, "invalid_request_error", "not_supported_when_sharded"),
    "model_not_found": ErrorSpec(404, "invalid_request_error", "model_not_found"),
    # LoRA adapters (issue 25): --max-adapters mounted at once is a full resource
    # (as too_many_sessions), a stack past --max-adapter-stack a request to fix, the
    # same numbers under a second id a conflict with the mount that holds them.
    "too_many_adapters": ErrorSpec(429, "resource_admission", "too_many_adapters"),
    "adapter_stack_too_deep": ErrorSpec(400, "invalid_request_error", "adapter_stack_too_deep"),
    "adapter_already_mounted": ErrorSpec(409, "invalid_request_error", "adapter_already_mounted"),
}

#: The only message an internal failure ever shows a client.
INTERNAL_MESSAGE = "internal server error"


class ApiError(Exception):
    """A client-visible failure, rendered through :data:`ERROR_TABLE`.

    Args:
        kind (str): a key of :data:`ERROR_TABLE`.
        message (str): the human-readable message sent to the client.
        param (str | None): the request field at fault, e.g. ``"messages[0].role"``.
            Default: ``None``.
        headers (dict[str, str] | None): extra response headers (e.g. ``Allow``).
            Default: ``None``.

    Raises:
        KeyError: if ``kind`` is not a row of the table (a programming error).
    """

    def __init__(
        self,
        kind: str,
        message: str,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.spec = ERROR_TABLE[kind]
        self.kind = kind
        self.message = message
        self.param = param
        self.headers = headers or {}

    @property
    def status(self) -> int:
        """The HTTP status of this error's row."""
        return self.spec.status

    @classmethod
    def internal(cls) -> ApiError:
        """The error sent for any unexpected exception: fixed text, no leak."""
        return cls("server_error", INTERNAL_MESSAGE)


#: HTTP status -> error kind, for the HTTP errors Connexion and Starlette raise.
_STATUS_KINDS = {
    400: "invalid_request",
    401: "unauthorized",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}

#: Connexion's 415 detail for a body of a type the operation does not take:
#: group 1 is the media type, group 2 the Python list repr of those it takes.
_CONNEXION_415 = re.compile(r"Invalid Content-type \((.*)\), expected (\[.*\])$")

#: Seconds a client refused for a full queue should wait (RFC 9110 section
#: 10.2.3): about one decode step of a full batch frees a slot.
RETRY_AFTER_S = 1

#: The message of the ``cancelled`` error (the client left).
CANCELLED_MESSAGE = "request cancelled"


def from_status(
    status: int, detail: Any = None, headers: Mapping[str, str] | None = None
) -> ApiError:
    """The error for an HTTP status raised by Connexion or Starlette.

    Args:
        status (int): the HTTP status.
        detail (Any): the exception's detail (or title). Default: ``None``.
        headers (Mapping[str, str] | None): the exception's headers; a 405's
            ``Allow`` is kept. Default: ``None``.

    Returns:
        ApiError: the row of :data:`_STATUS_KINDS`; another 4xx is
        ``invalid_request`` with the detail, a 5xx the internal error's text.
        A 404 or 405 says ``not found`` / ``method not allowed``; Connexion's
        415 names the media type in the API's words; jsonschema's report after
        a parameter's message is cut; a 401 names the ``Bearer`` scheme (RFC
        6750 section 3).
    """
    kind = _STATUS_KINDS.get(status)
    if kind is None:
        return ApiError(
            "server_error" if status >= 500 else "invalid_request",
            INTERNAL_MESSAGE if status >= 500 else str(detail),
        )
    messages = {"not_found": "not found", "method_not_allowed": "method not allowed"}
    message = messages.get(kind) or str(detail or kind.replace("_", " "))
    if kind == "unsupported_media_type" and (media := _CONNEXION_415.match(message)):
        # Connexion's text ends in a Python list repr; say it in the API's words,
        # naming the types the route takes (the audio routes: multipart/form-data too)
        message = f"Content-Type '{media[1]}' is not supported: send {_accepted(media[2])}"
    # Connexion's parameter validation passes jsonschema's whole report (the failing
    # schema and instance after a blank line): the first line is the message.
    message = message.split("\n\nFailed validating", 1)[0]
    allow = (headers or {}).get("Allow") if kind == "method_not_allowed" else None
    if kind == "unauthorized":
        return ApiError(kind, message, headers={"WWW-Authenticate": "Bearer"})
    return ApiError(kind, message, headers={"Allow": allow} if allow else None)


def media_types_text(types: Sequence[str]) -> str:
    """Media types as a 415 message names them: ``"multipart/form-data or
    application/json"``; ``"application/json"`` for none."""
    types = list(types) or ["application/json"]
    return ", ".join(types[:-1]) + " or " + types[-1] if len(types) > 1 else types[0]


def _accepted(listed: str) -> str:
    """Connexion's repr of an operation's request types,
    ``"['multipart/form-data', 'application/json']"``, in a message's words."""
    return media_types_text(re.findall(r"'([^']+)'", listed))


def from_exception(exc: BaseException) -> ApiError:
    """The client-visible error for anything a request raised.

    One mapping for every surface: an :class:`ApiError` is itself; the
    engine's request errors keep their message and ``param`` (a prompt over
    the context window is ``context_length_exceeded``, one over the operator's
    budget ``context_over_budget``, any other ``invalid_request``), a full
    queue is ``queue_full`` with ``Retry-After``; an HTTP error of Connexion or
    Starlette goes through :func:`from_status`; a multipart body Starlette's
    parser refuses (no boundary, a field over its 1 MiB part limit) is
    ``invalid_request`` with the parser's reason. Anything else is logged with
    its traceback and becomes :meth:`ApiError.internal`.

    Args:
        exc (BaseException): what was raised.

    Returns:
        ApiError: the error to render.
    """
    if isinstance(exc, ApiError):
        return exc
    # Imported here so this module stays importable without the engine (the
    # conformance tools read the table against a server elsewhere).
    from mlxspec.engine import (
        ContextBudgetError,
        ContextLengthError,
        EngineRequestError,
        QueueFullError,
    )

    if isinstance(exc, QueueFullError):
        retry = {"Retry-After": str(RETRY_AFTER_S)}
        return ApiError("queue_full", exc.message, headers=retry)
    if isinstance(exc, EngineRequestError):
        kind = exc.error_kind  # invalid_request, or a row of its own (adapter limits)
        if isinstance(exc, ContextLengthError):
            kind = "context_length_exceeded"
        elif isinstance(exc, ContextBudgetError):
            kind = "context_over_budget"
        return ApiError(kind, exc.message, param=exc.param)
    if isinstance(exc, MultiPartException):
        # Connexion's form validator calls Starlette's parser directly, so the
        # 400 that Request.form() would make of this never happens upstream.
        return ApiError("invalid_request", f"malformed multipart body: {exc.message}")
    if isinstance(exc, HTTPException):  # Connexion's ProblemException is one too
        detail = exc.detail or getattr(exc, "title", None)
        return from_status(exc.status_code, detail, exc.headers)
    log.error("unhandled error", exc_info=exc)
    return ApiError.internal()


def from_failure(event: Any) -> ApiError:
    """The error of an engine request that ended without finishing.

    Args:
        event (Failed | Cancelled): the request's last event.

    Returns:
        ApiError: ``server_error`` with a ``Failed`` event's message (the
        engine writes it to be shown), ``cancelled`` (the client left) for
        ``Cancelled``.
    """
    from mlxspec.engine import Failed  # see from_exception

    if isinstance(event, Failed):
        return ApiError(event.error, event.message)
    return ApiError("cancelled", CANCELLED_MESSAGE)


def openai_error_body(err: ApiError) -> dict[str, Any]:
    """Render ``err`` in OpenAI's envelope.

    Returns:
        dict: ``{"error": {"message", "type", "param", "code"}}`` (OpenAI API
        reference, "Error codes").
    """
    return {
        "error": {
            "message": err.message,
            "type": err.spec.type,
            "param": err.param,
            "code": err.spec.code,
        }
    }


def openai_error_json(err: ApiError) -> str:
    """``openai_error_body`` serialised compactly, for HTTP bodies and SSE frames."""
    return json.dumps(openai_error_body(err), separators=(",", ":"))


#: HTTP status -> Anthropic ``error.type`` (Anthropic API reference, "Errors";
#: its 529 ``overloaded_error`` is our 503, a 499 cancel has no row of its own).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    """Anthropic's ``error.type`` for an HTTP status.

    Args:
        status (int): the HTTP status of the error.

    Returns:
        str: the listed type, else ``api_error`` for a 5xx and
        ``invalid_request_error`` for a 4xx (the reference's formatter).
    """
    fallback = "api_error" if status >= 500 else "invalid_request_error"
    return _ANTHROPIC_TYPES.get(status, fallback)


def anthropic_error_body(err: ApiError) -> dict[str, Any]:
    """Render ``err`` in Anthropic's envelope.

    Returns:
        dict: ``{"type": "error", "error": {"type", "message"}}`` with the type
        of :func:`anthropic_error_type`; used for HTTP bodies and ``event: error``
        stream frames alike.
    """
    return {
        "type": "error",
        "error": {"type": anthropic_error_type(err.status), "message": err.message},
    }


#: Error kinds the System One surface reports as FastAPI-style 422 validation
#: details (Jev System One API; the reference's ``/v1/systemone`` route).
_SYSTEMONE_VALIDATION = frozenset({"invalid_request", "invalid_json"})


def systemone_error_body(err: ApiError) -> dict[str, Any]:
    """Render ``err`` for ``/v1/systemone``.

    Request validation failures become ``{"detail": [{"loc", "msg", "type"}]}``
    (sent with status 422, see :func:`error_status`): ``loc`` is ``"body"``
    followed by the dotted ``param``'s parts, ``type`` is ``value_error``. Every
    other error keeps OpenAI's envelope, as the reference does.
    """
    if err.kind not in _SYSTEMONE_VALIDATION:
        return openai_error_body(err)
    loc = ["body", *err.param.split(".")] if err.param else ["body"]
    return {"detail": [{"loc": loc, "msg": err.message, "type": "value_error"}]}


def lab_error_body(err: ApiError) -> dict[str, Any]:
    """Render ``err`` for the jobs and lab routes (``/api/jobs``, ``/api/finetune``,
    ``/api/quantize``, ``/api/dataset``): ``{"ok": false, "error": "<message>"}``
    (reference, "Jobs" and "Fine-tune": ``400 { "ok": false, "error" }``)."""
    return {"ok": False, "error": err.message}


#: surface name -> envelope renderer. Every route belongs to one surface.
RENDERERS = {
    "openai": openai_error_body,
    "anthropic": anthropic_error_body,
    "systemone": systemone_error_body,
    "lab": lab_error_body,
}

#: surface -> {error kind: status} where a surface answers with another status
#: than the table's row.
STATUS_OVERRIDES: dict[str, dict[str, int]] = {
    "systemone": dict.fromkeys(_SYSTEMONE_VALIDATION, 422),
}

#: Path prefixes of non-OpenAI surfaces; every other path is "openai".
SURFACE_PREFIXES = (
    ("/v1/messages", "anthropic"),
    ("/v1/systemone", "systemone"),
    ("/api/jobs", "lab"),
    ("/api/finetune", "lab"),
    ("/api/quantize", "lab"),
    ("/api/dataset", "lab"),
)


def surface_for_path(path: str) -> str:
    """The surface whose error envelope a request on ``path`` gets."""
    for prefix, surface in SURFACE_PREFIXES:
        if path == prefix or path.startswith(prefix + "/"):
            return surface
    return "openai"


def error_status(err: ApiError, surface: str = "openai") -> int:
    """The HTTP status of ``err`` on ``surface`` (:data:`STATUS_OVERRIDES`, else its row's)."""
    return STATUS_OVERRIDES.get(surface, {}).get(err.kind, err.status)


def error_body(err: ApiError, surface: str = "openai") -> dict[str, Any]:
    """Render ``err`` in ``surface``'s envelope (a key of :data:`RENDERERS`)."""
    return RENDERERS[surface](err)


def error_json(err: ApiError, surface: str = "openai") -> str:
    """``error_body`` serialised compactly, for HTTP bodies and SSE frames."""
    return json.dumps(error_body(err, surface), separators=(",", ":"))


async def send_error(scope: Any, send: Any, err: ApiError, close: bool = False) -> None:
    """Answer ``err`` on an ASGI ``send`` in the envelope of the path's surface,
    for middleware that answers before Connexion sees the request.

    Args:
        scope (Scope): the request's ASGI scope (its ``path`` picks the surface).
        send (Send): the ASGI send channel.
        err (ApiError): the error; its ``headers`` are sent too.
        close (bool): ask the client to close the connection. Default: ``False``.
    """
    surface = surface_for_path(scope.get("path", ""))
    payload = error_json(err, surface).encode()
    headers = [(b"content-type", b"application/json")]
    headers += [(b"connection", b"close")] if close else []
    headers += [(k.lower().encode(), v.encode()) for k, v in (err.headers or {}).items()]
    headers.append((b"content-length", str(len(payload)).encode()))
    status = error_status(err, surface)
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload})

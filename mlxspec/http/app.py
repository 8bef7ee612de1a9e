"""The ASGI application: the OpenAPI document, Connexion, and the error table.

:func:`create_app` builds a Connexion ``AsyncApp`` from the package's OpenAPI
3.1 document. Connexion validates each request against the document and
dispatches by ``operationId`` (``createChatCompletion`` ->
``mlxspec.handlers.chat.chat.create_chat_completion``) to the handlers, which find
the engine in the ASGI scope. Every error, from validation, routing, handlers
or the engine, is rendered through :mod:`mlxspec.errors`.

Around Connexion, outermost first: the ``Host``/``Origin`` checks
(:mod:`mlxspec.http.guard`), CORS (only with allowed origins), request metrics
(:mod:`mlxspec.http.metrics`), the web chat's WebSocket (:mod:`mlxspec.http.ws_chat`),
and :class:`_WithEngine`. API keys are
checked by Connexion's security middleware (:mod:`mlxspec.http.security`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import connexion
from connexion.datastructures import MediaTypeDict
from connexion.exceptions import ProblemException
from connexion.lifecycle import ConnexionRequest, ConnexionResponse
from connexion.resolver import Resolver
from connexion.validators import MultiPartFormDataValidator
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from mlxspec.config import ServeConfig
from mlxspec.engine import DEFAULT_SESSION_IDLE_S, EngineRequestError, QueueFullError, Sessions
from mlxspec.errors import (
    ApiError,
    error_json,
    error_status,
    from_exception,
    from_status,
    media_types_text,
    send_error,
    surface_for_path,
)
from mlxspec.handlers.responses.shared_store import process_store
from mlxspec.http.access_log import ErrorNotes
from mlxspec.http.aliases import PathAliases, path_aliases
from mlxspec.http.cors import ApiCORSMiddleware
from mlxspec.http.dispatch import MIDDLEWARES, prepare_app, remember_body_definitions
from mlxspec.http.guard import RequestGuard
from mlxspec.http.metrics import Metrics, RequestMetricsMiddleware, RouteLabels
from mlxspec.http.paths import (
    METHOD_ORDER,
    allowed_methods,
    post_body_types,
    post_takes_body,
    shadowed_methods,
    suggest_path,
)
from mlxspec.http.security import key_refusal, security_options
from mlxspec.http.ws_chat import ChatSocketMount
from mlxspec.library import Downloads, Registry
from mlxspec.openapi import served_spec
from mlxspec.openapi.validation import (
    RequestBodyValidator,
    ResponseBodyValidator,
    enable_openapi_31,
)

#: The 415 message of a POST body sent without ``Content-Type`` (on a JSON route).
NO_TYPE = "a request body needs a Content-Type: send application/json"


def _no_type(types: tuple[str, ...]) -> str:
    """:data:`NO_TYPE`, naming the route's own body types (the audio routes take
    ``multipart/form-data`` first)."""
    return f"a request body needs a Content-Type: send {media_types_text(types)}"


class SnakeCaseResolver(Resolver):
    """Resolve OpenAI-style ``operationId``s to snake_case functions of the
    operation's ``x-openapi-router-controller`` module."""

    def resolve_operation_id(self, operation: Any) -> str:
        """``createChatCompletion`` -> ``<controller>.create_chat_completion``."""
        import inflection

        return f"{operation.router_controller}.{inflection.underscore(operation.operation_id)}"


def _render(
    err: ApiError, req: ConnexionRequest | None = None, surface: str | None = None
) -> ConnexionResponse:
    """``err`` as an HTTP response in the envelope of ``surface`` (default: the
    request's)."""
    if surface is None:
        surface = surface_for_path(req.url.path) if req is not None else "openai"
    return ConnexionResponse(
        status_code=error_status(err, surface),
        mimetype="application/json",
        headers=err.headers,
        body=error_json(err, surface),
    )


def _error(req: ConnexionRequest, exc: Exception) -> ConnexionResponse:
    """Any exception a request raised, answered as :func:`~mlxspec.errors.from_exception`
    maps it (an unexpected one is logged there)."""
    return _render(from_exception(exc), req)


def _problem_handler(
    allow: Callable[[str], str | None], suggest: Callable[[str, str], str | None]
) -> Callable[[ConnexionRequest, Exception], ConnexionResponse]:
    """:func:`_error` for the HTTP errors of routing and Connexion, with a
    405's ``Allow`` taken from the document
    (:func:`~.paths.allowed_methods`) and a route-miss 404 naming the route a
    mistyped base URL meant (:func:`~.paths.suggest_path`), in that route's
    surface's envelope (an ``anthropic`` SDK pointed at ``/v1`` parses it). With
    an API key, a route or method miss without the key is a 401 first (as
    llama.cpp's server and vLLM check the key before routing)."""

    def handle(req: ConnexionRequest, exc: Exception) -> ConnexionResponse:
        err = from_exception(exc)
        if err.kind in ("not_found", "method_not_allowed"):
            config = req.scope.get("state", {}).get("config")
            if refusal := key_refusal(req, getattr(config, "api_key", None)):
                return _render(from_status(401, refusal), req)
        path = req.url.path
        if err.kind == "method_not_allowed" and path.endswith("/") and path != "/":
            # a templated route took the slash as an empty last parameter
            # (POST /v1/models/): a path no operation declares, as GET's 404 says
            err = from_status(404)
        if err.kind == "method_not_allowed":
            if methods := allow(path):
                err.headers["Allow"] = methods
        elif err.kind == "not_found" and (guess := suggest(path, req.method)) is not None:
            why = (
                "no trailing slash" if guess == path.rstrip("/") else "check the client's base URL"
            )
            message = f"not found: did you mean {guess}? ({why})"
            return _render(ApiError("not_found", message), req, surface_for_path(guess))
        return _render(err, req)

    return handle


class _Refused(Exception):
    """A request answered before Connexion sees it, by a step of
    :meth:`_WithEngine._admit` (``close``: ask the client to close the connection)."""

    def __init__(self, error: ApiError, close: bool = False) -> None:
        super().__init__(error.message)
        self.error, self.close = error, close


class _WithEngine:
    """ASGI wrapper in front of Connexion: the steps every HTTP request takes
    before Connexion sees it (:meth:`_admit`), each of which may answer it
    itself (:class:`_Refused`, in the envelope of the path's surface).

    1. :meth:`_share_state`: the engine, config, metrics and Responses store
       (one per app) go into ``scope["state"]``.
    2. :meth:`_check_method`: a method a literal path does not take is a 405,
       though a templated route also matches the path.
    3. GET/HEAD: :func:`_without_content_type` (they carry no body; Connexion
       would otherwise try to parse a form).
    4. POST: :meth:`_take_body` reads the body whole (up to
       ``--max-body-bytes``; 413 beyond, 408 when it arrives too slowly) and
       hands Connexion normalised headers (:func:`_post_headers`), after
       :meth:`_check_type`: a non-empty body without ``Content-Type`` is a 415
       (a browser page can send such a body cross-origin without a preflight,
       see :mod:`mlxspec.http.guard`; a POST without a body needs no type).
    """

    def __init__(
        self,
        app: Any,
        engine: Any,
        config: Any,
        metrics: Metrics,
        spec: dict[str, Any],
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.app, self.engine, self.config, self.metrics = app, engine, config, metrics
        self.extra = extra or {}  # other services' state (the Whisper service)
        # an --isolate child's store is its parent's (it outlives the child)
        self.response_store = process_store(
            getattr(config, "response_store", None), getattr(config, "response_store_key", None)
        )
        self.library = Registry()  # the model library's scan, one per app
        self.downloads = Downloads(on_done=self.library.invalidate)
        # Concrete paths a templated route also matches (see literal_methods).
        self.literal = shadowed_methods(spec)
        self.takes_body = post_takes_body(spec)
        self.body_types = post_body_types(spec)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            try:
                scope, receive = await self._admit(scope, receive)
            except _Refused as refused:
                await send_error(scope, send, refused.error, close=refused.close)
                return
        await self.app(scope, receive, send)

    async def _admit(self, scope: Scope, receive: Receive) -> tuple[Scope, Receive]:
        """The steps, in order (see the class); returns the scope and channel
        Connexion gets.

        Raises:
            _Refused: a step answered the request.
        """
        self._share_state(scope)
        self._check_method(scope)
        method = scope.get("method")
        if method in ("GET", "HEAD"):
            scope = _without_content_type(scope)
        elif method == "POST":
            scope, receive = await self._take_body(scope, receive)
        return scope, receive

    def _share_state(self, scope: Scope) -> None:
        state = scope.setdefault("state", {})
        state["engine"], state["config"] = self.engine, self.config
        state["metrics"] = self.metrics
        state["response_store"] = self.response_store
        state["library"], state["downloads"] = self.library, self.downloads
        state.update(self.extra)

    def _check_method(self, scope: Scope) -> None:
        """Raises :class:`_Refused` (405, with ``Allow``) for a method the
        literal path does not take."""
        methods = self.literal.get(scope.get("path", ""))
        method = scope.get("method")
        if methods is not None and method not in methods and method != "OPTIONS":
            allow = ", ".join(m for m in METHOD_ORDER if m in methods)
            headers = {"Allow": allow}
            raise _Refused(ApiError("method_not_allowed", "method not allowed", headers=headers))

    async def _take_body(self, scope: Scope, receive: Receive) -> tuple[Scope, Receive]:
        """Read a POST's body whole; Connexion gets it again through
        :func:`_replay`, with the headers of :func:`_post_headers`.

        Raises:
            _Refused: 413 over ``--max-body-bytes``, 408 when the body arrives
                too slowly (:func:`_read_capped`), both closing the connection;
                415 from :meth:`_check_type`.
        """
        limit = getattr(self.config, "max_body_bytes", None)
        try:
            body = await _read_capped(receive, limit, _declared_length(scope.get("headers", [])))
        except _BodyTooLarge:
            err = ApiError("payload_too_large", f"request body exceeds {limit} bytes")
            raise _Refused(err, close=True) from None
        except TimeoutError:
            err = ApiError(
                "request_timeout",
                f"the request body arrived too slowly: it may pause for at most "
                f"{BODY_IDLE_TIMEOUT_S:g} s and must average {BODY_MIN_RATE} bytes/s "
                "after that",
            )
            raise _Refused(err, close=True) from None
        headers = _post_headers(scope.get("headers", []), len(body))
        if body:
            self._check_type(scope["path"], headers)
        return {**scope, "headers": headers}, _replay(body, receive)

    def _check_type(self, path: str, headers: list[tuple[bytes, bytes]]) -> None:
        """Raises :class:`_Refused` (415) for a POST body with these (normalised)
        headers that has no ``Content-Type``, or is not JSON on a route that
        takes no body. Connexion refuses other types on the routes that declare
        a body; a path without a POST operation is left to routing (404, 405)."""
        takes_body = self.takes_body(path)
        if takes_body is None:
            return
        media = next((v for k, v in headers if k == b"content-type"), b"")
        why = None
        if not media:  # absent or empty (Connexion would read the body as JSON)
            why = _no_type(self.body_types(path))
        elif not takes_body and media.partition(b";")[0].decode("latin-1") != "application/json":
            why = f"{path} takes no request body: send none, or send application/json"
        if why is not None:
            raise _Refused(ApiError("unsupported_media_type", why))


def _without_content_type(scope: Scope) -> Scope:
    """``scope`` without its ``Content-Type`` headers."""
    kept = [(k, v) for k, v in scope.get("headers", []) if k != b"content-type"]
    return {**scope, "headers": kept}


def _post_headers(headers: list[tuple[bytes, bytes]], length: int) -> list[tuple[bytes, bytes]]:
    """A POST's headers as Connexion needs them once the body has been read.

    - ``Content-Type`` is normalised: media types are case-insensitive and
      whitespace around ``;`` is allowed (RFC 9110 section 8.3.1), but
      Connexion's validator map matches ``*/*json`` case-sensitively and skips
      validation for ``application/JSON`` (the handler then got raw bytes: a
      500), and it refuses ``application/json ; charset=utf-8``. Absent, it is
      ``application/json`` for an empty body (Connexion then answers "request
      body is required" where the route needs one, and passes ``None`` where
      not) and stays absent otherwise (:meth:`_WithEngine._type_refusal`
      refuses such a body).
    - ``Content-Length`` is the body's length and ``Transfer-Encoding`` is
      dropped: the body is whole now, and Connexion takes a request without a
      length for one without a body (a chunked upload was "request body is
      required").

    Args:
        headers (list[tuple[bytes, bytes]]): the ASGI scope's raw headers.
        length (int): bytes of the body read.

    Returns:
        list[tuple[bytes, bytes]]: the headers to pass on.
    """
    out, media = [], None
    for key, value in headers:
        if key == b"content-type" and media is None:
            kind, _, params = value.partition(b";")
            parts = [kind.strip().lower()] + [p.strip() for p in params.split(b";") if p.strip()]
            media = b"; ".join(parts)
        elif key not in (b"content-type", b"content-length", b"transfer-encoding"):
            out.append((key, value))
    if media is None and length == 0:  # no body: the empty JSON body, "required" where it is
        media = b"application/json"
    typed = [(b"content-type", media)] if media is not None else []
    return [*out, *typed, (b"content-length", str(length).encode())]


#: Seconds a request body may stop arriving before the request is answered 408
#: and the connection closed (nginx's ``client_body_timeout`` is 60 s). Without
#: it a client that sent part of a body held its connection, and a shutdown
#: waited out the whole drain time (120 s) for it.
BODY_IDLE_TIMEOUT_S = 30.0
#: Bytes per second a body must average once :data:`BODY_IDLE_TIMEOUT_S` has
#: passed (as Apache's ``mod_reqtimeout`` ``MinRate``), so a client trickling a
#: byte every few seconds cannot hold a connection past the idle timeout either.
BODY_MIN_RATE = 1000


class _BodyTooLarge(Exception):
    """The body is, or declares to be, over ``--max-body-bytes``."""


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The ``Content-Length`` a request declares (``None`` when absent or unreadable:
    the server has already refused a malformed one, or the body is chunked)."""
    for key, value in headers:
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _read_capped(receive: Receive, limit: int | None, declared: int | None = None) -> bytes:
    """The whole request body, read here, before Connexion parses and validates
    it on the event loop, so an oversized body costs no parsing.

    Args:
        receive (Receive): the ASGI channel.
        limit (int | None): most bytes accepted; ``None`` for no cap.
        declared (int | None): the body's ``Content-Length``, when given: one
            over ``limit`` is refused before any byte is read.

    Raises:
        _BodyTooLarge: the body is, or declares to be, over ``limit`` bytes.
        TimeoutError: no part of it arrived for :data:`BODY_IDLE_TIMEOUT_S`
            seconds, or, past those, it averaged under :data:`BODY_MIN_RATE` bytes/s.
    """
    if limit is not None and declared is not None and declared > limit:
        raise _BodyTooLarge
    chunks, size = [], 0
    clock = asyncio.get_running_loop().time
    started = clock()
    while True:
        deadline = started + BODY_IDLE_TIMEOUT_S + size / BODY_MIN_RATE
        wait = min(BODY_IDLE_TIMEOUT_S, deadline - clock())
        if wait <= 0:
            raise TimeoutError
        message = await asyncio.wait_for(receive(), wait)
        if message["type"] != "http.request":
            break  # the client left; the app sees an empty body, then the disconnect
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _replay(body: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``body`` once, then the real channel (disconnects)."""
    sent = False

    async def replay() -> Any:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay


def create_app(
    engine: Any,
    config: Any = None,
    *,
    validate_responses: bool = False,
    transcriber: Any = None,
) -> Any:
    """Build the ASGI app serving the OpenAPI document's routes.

    Args:
        engine: an :class:`mlxspec.engine.Engine` (or a fake with the same
            methods), already started.
        config (ServeConfig | None): the server's settings; its ``api_key``
            and ``allowed_origins`` apply here. Default: ``None`` (defaults).
        validate_responses (bool): validate JSON responses against the document
            (a non-conforming response becomes a 500). Default: ``False``.
        transcriber (WhisperService | None): the Whisper service of
            ``/v1/audio/*``; ``None`` answers those routes 503. ``engine`` may be
            ``None`` beside one (a transcription-only server). Default: ``None``.

    Returns:
        An ASGI application for uvicorn.
    """
    config = config or ServeConfig()
    enable_openapi_31()
    remember_body_definitions()
    spec = served_spec(
        config.logprobs_format,
        config.allow_request_templates,
        getattr(config, "unix", None) is not None,
        bool(config.jobs_roots),
    )
    security_map = security_options(spec, config.api_key)
    app = connexion.AsyncApp("mlxspec", security_map=security_map, middlewares=MIDDLEWARES)
    prepare_app(app)  # handlers decorated once, not per request; no slash redirects
    app.add_api(
        spec,
        resolver=SnakeCaseResolver(),
        validator_map={
            "body": MediaTypeDict(
                {
                    "*/*json": RequestBodyValidator,
                    "multipart/form-data": MultiPartFormDataValidator,
                }
            ),
            "response": MediaTypeDict({"*/*json": ResponseBodyValidator}),
        },
        validate_responses=validate_responses,
        swagger_ui_options=connexion.options.SwaggerUIOptions(
            spec_path="/openapi.json", swagger_ui=False
        ),
    )
    for raised in (ApiError, EngineRequestError, QueueFullError):
        app.add_error_handler(raised, _error)
    problem = _problem_handler(allowed_methods(spec), suggest_path(spec))
    app.add_error_handler(404, problem)
    app.add_error_handler(405, problem)
    app.add_error_handler(ProblemException, problem)
    app.add_error_handler(HTTPException, problem)
    app.add_error_handler(Exception, _error)
    metrics = Metrics(engine)
    extra = {**_audio_state(transcriber, config), **_jobs_state(engine, config)}
    asgi: Any = _WithEngine(app, engine, config, metrics, spec, extra)
    if engine is not None:  # a transcription-only server has no chat to drive
        # /ws/chat, beside Connexion; its ready frame says whether the microphone may show
        asgi = ChatSocketMount(asgi, engine, config, metrics, transcriber is not None)
    asgi = RequestMetricsMiddleware(asgi, metrics, RouteLabels(spec))
    if config.allowed_origins:
        asgi = ApiCORSMiddleware(
            asgi,
            allow_origins=list(config.allowed_origins),
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=["Retry-After"],
        )
    return ErrorNotes(PathAliases(RequestGuard(asgi, config), path_aliases(spec)))


#: Connexion warns on every request to an operation that takes several body types
#: (the audio routes: multipart, JSON, raw audio) that it names the body after one.
logging.getLogger("connexion.operations.openapi3").setLevel(logging.ERROR)


def _audio_state(transcriber: Any, config: Any) -> dict[str, Any]:
    """The Whisper service and its dictation sessions, for the audio handlers
    (which see the service as a ``TranscriberProtocol``)."""
    if transcriber is None:
        return {}
    max_audio_s = getattr(config, "max_audio_seconds", None)
    idle_s = getattr(config, "audio_session_idle", DEFAULT_SESSION_IDLE_S)
    if hasattr(transcriber, "sessions"):  # the service keeps them (a worker process does)
        sessions = transcriber.sessions(max_audio_s, idle_s)
    else:
        sessions = Sessions(transcriber, max_audio_s, idle_s=idle_s)
    return {"transcriber": transcriber, "transcription_sessions": sessions}


def _jobs_state(engine: Any, config: Any) -> dict[str, Any]:
    """The job manager under ``--jobs`` (its start marks the jobs a previous
    server left running as ``zombie``); nothing otherwise."""
    if not config.jobs_roots:
        return {}
    from mlxspec.jobs import JobManager, JobRoots

    return {"jobs": JobManager(JobRoots(config.jobs_roots), engine)}

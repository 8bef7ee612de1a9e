"""Response-contract checks: any HTTP response against the OpenAPI document.

:func:`check_response` validates one response (status, declared headers, body)
with openapi-core 0.23 against ``mlxspec/openapi/openapi.yaml``. Event streams
are checked frame by frame, since the document's ``text/event-stream`` schema
describes one event (OpenAPI 3.1 has no ``itemSchema``): every frame must be
``data: <payload>\\n\\n`` (or a ``:`` comment), each payload must match the event
schema and its ``contentSchema``, and the stream must end with ``data: [DONE]``
or an error frame. Where the event schema requires ``event`` (the Responses
stream), every frame is ``event: <name>`` plus ``data: <payload>`` instead and
the payload's ``type`` repeats the name. Responses outside any operation
follow the conventions of the document's description: unknown paths answer
404 and undeclared methods 405 with ``Allow``, both with an ``ErrorResponse``
body; every error body agrees with :data:`mlxspec.errors.ERROR_TABLE`. Paths of the
Anthropic surface (``/v1/messages...``) follow its own rules instead
(:mod:`mlxspec.conformance.anthropic_contract`): ``AnthropicErrorResponse``
bodies and its event grammar.

:mod:`mlxspec.conformance.httpx_checks` runs these checks on every response an
httpx client (or the openai SDK over one) receives.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
from jsonschema_path import SchemaPath
from openapi_core import OpenAPI
from openapi_core.testing import MockRequest, MockResponse
from openapi_core.validation.response.validators import V31ResponseHeadersValidator
from openapi_core.validation.schemas import oas31_schema_validators_factory
from openapi_core.validation.schemas.exceptions import InvalidSchemaValue

from mlxspec.errors import ERROR_TABLE, surface_for_path
from mlxspec.openapi import load_spec

__all__ = [
    "ContractViolation",
    "check_event_stream",
    "check_response",
    "split_event_stream",
    "split_named_event_stream",
]

HOST = "http://mlxspec.test"
SSE = "text/event-stream"
#: Routes the app serves outside the document (Connexion's own spec route).
UNDOCUMENTED_GET = {"/openapi.json"}
_ERROR_ROWS = {(row.status, row.type, row.code) for row in ERROR_TABLE.values()}


class ContractViolation(AssertionError):
    """A response that breaks the contract of the OpenAPI document."""


@functools.cache
def _api() -> OpenAPI:
    return OpenAPI.from_dict(load_spec())


@functools.cache
def _headers_validator() -> V31ResponseHeadersValidator:
    return V31ResponseHeadersValidator(_api().spec)


@functools.cache
def _routes() -> list[tuple[re.Pattern[str], str]]:
    """``(regex, template)`` per documented path, literal paths first.

    A parameter with ``format: path`` matches any rest of the path, ``/`` and
    empty included (Starlette's ``path`` converter, which Connexion uses for
    model ids such as ``org/name``); others match one non-empty segment.
    """
    spec = load_spec()
    out = []
    for template, item in spec["paths"].items():
        params = [
            _deref(spec, p)
            for op in item.values()
            if isinstance(op, dict)
            for p in op.get("parameters", [])
        ]
        path_params = {p["name"] for p in params if p.get("schema", {}).get("format") == "path"}
        regex = ""
        for i, part in enumerate(re.split(r"\{(\w+)\}", template)):
            if i % 2 == 0:
                regex += re.escape(part)
            else:
                regex += f"(?P<{part}>{'.*' if part in path_params else '[^/]+'})"
        out.append((re.compile(f"^{regex}$"), template))
    return sorted(out, key=lambda r: r[1].count("{"))


def _deref(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = spec
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _fail(where: str, message: str) -> ContractViolation:
    return ContractViolation(f"{where}: {message}")


def _describe(exc: BaseException) -> str:
    """One readable line per schema error found under an openapi-core exception."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, InvalidSchemaValue):
        cause = cause.__cause__
    if cause is None:
        return f"{type(exc).__name__}: {exc}"
    lines = []
    for err in cause.schema_errors:
        path = "".join(f"[{p!r}]" for p in getattr(err, "absolute_path", ()))
        lines.append(f"body{path}: {getattr(err, 'message', err)}")
    return "; ".join(lines) or str(cause)


def _mimetype(headers: Mapping[str, str]) -> str:
    return headers.get("content-type", "").split(";")[0].strip().lower()


def check_response(
    method: str,
    path: str,
    request_body: bytes | None,
    status: int,
    headers: Mapping[str, str],
    body_bytes: bytes | None,
) -> None:
    """Check one HTTP response against the OpenAPI document.

    Args:
        method (str): the request method, any case. ``HEAD`` is checked as
            ``GET`` without a body (RFC 9110 section 9.3.2).
        path (str): the request path as sent (percent-encoded), optionally
            with a query string.
        request_body (bytes | None): the request body; a JSON object's
            ``stream`` field decides which media type a 200 must have.
        status (int): the response status code.
        headers (Mapping[str, str]): response headers; names in any case.
        body_bytes (bytes | None): the whole response body, or ``None`` when
            it was not read (only status and headers are checked then).

    Raises:
        ContractViolation: the first breach found, naming the request and the
            rule, e.g. ``POST /v1/completions -> 200: body['choices']: ...``.
    """
    method = method.upper()
    path = urlsplit(path).path or "/"
    where = f"{method} {path} -> {status}"
    headers = httpx.Headers(headers)
    if method == "HEAD":
        method, body_bytes = "GET", None
    match = _match(path)
    if match is None:
        _check_outside(method, path, status, headers, body_bytes, where)
        return
    template, view_args = match
    operations = {m for m in load_spec()["paths"][template] if m.isalpha()}
    if method.lower() not in operations:
        surface = surface_for_path(path)
        _check_method_not_allowed(operations, status, headers, body_bytes, where, surface)
        return
    request = MockRequest(
        HOST, method, path, path_pattern=template, view_args=view_args, data=request_body
    )
    _check_operation(request, template, status, headers, body_bytes, where)


def _match(path: str) -> tuple[str, dict[str, str]] | None:
    for regex, template in _routes():
        m = regex.match(path)
        if m:
            return template, {k: unquote(v) for k, v in m.groupdict().items()}
    return None


def _check_operation(
    request: MockRequest,
    template: str,
    status: int,
    headers: httpx.Headers,
    body: bytes | None,
    where: str,
) -> None:
    api = _api()
    mimetype = _mimetype(headers)
    response = MockResponse(body or b"", status, list(headers.multi_items()), mimetype)
    errors = list(_headers_validator().iter_errors(request, response))  # status and headers
    if errors:
        raise _fail(where, "; ".join(_describe(e) for e in errors))
    content = api.spec / "paths" / template / request.method / "responses" / str(status)
    content = content / "content"
    if mimetype not in content.str_keys():
        raise _fail(where, f"Content-Type {mimetype!r} not declared: {list(content.str_keys())}")
    _check_stream_flag(request.body, content, mimetype, status, where)
    if body is None:
        return
    surface = surface_for_path(template)
    if mimetype == SSE:
        # openapi-core would read the stream as one event: check frame by frame.
        if surface == "anthropic":
            _check_named_event_stream(content / SSE / "schema", body, where)
        else:
            check_event_stream(content / SSE / "schema", body, where)
        if headers.get("cache-control") != "no-cache":
            raise _fail(where, "an event stream must be sent with Cache-Control: no-cache")
        return
    errors = list(api.iter_response_errors(request, response))
    if errors:
        raise _fail(where, "; ".join(_describe(e) for e in errors))
    # Error statuses carry an error envelope (the schemas require "error"), except
    # where the document declares another body (the flush route's 503 report).
    if status >= 400 and "error" in _json(body, where):
        _check_error_row(status, body, where, surface)


def _check_stream_flag(
    request_body: bytes, content: SchemaPath, mimetype: str, status: int, where: str
) -> None:
    """Where JSON and SSE are both declared, the request's ``stream`` picks one
    (the generation routes' 200 description)."""
    if status != 200 or {"application/json", SSE} - set(content.str_keys()):
        return
    try:
        fields = json.loads(request_body or b"null")
    except ValueError:
        return
    streamed = isinstance(fields, dict) and fields.get("stream") is True
    expected = SSE if streamed else "application/json"
    if mimetype != expected:
        raise _fail(where, f"stream={streamed} must answer {expected}, got {mimetype}")


def _check_outside(
    method: str,
    path: str,
    status: int,
    headers: httpx.Headers,
    body: bytes | None,
    where: str,
) -> None:
    """A path no operation declares: Connexion's spec route, a trailing-slash
    redirect to a documented path, or a 404 ``ErrorResponse``."""
    if path in UNDOCUMENTED_GET:
        if method != "GET":
            _check_method_not_allowed({"get"}, status, headers, body, where, "openai")
        elif status != 200 or (body is not None and _json(body, where).get("paths") is None):
            raise _fail(where, "the OpenAPI document route must answer 200 with the document")
        return
    if status in (307, 308):
        target = urlsplit(headers.get("location", "")).path
        if path.endswith("/") and target == path.rstrip("/") and _match(target):
            return
        raise _fail(where, f"redirect to {target!r} is not the documented {path.rstrip('/')!r}")
    if status != 404:
        raise _fail(where, "a path outside the document must answer 404")
    _check_error_body(status, headers, body, where, surface_for_path(path))


def _check_method_not_allowed(
    operations: set[str],
    status: int,
    headers: httpx.Headers,
    body: bytes | None,
    where: str,
    surface: str,
) -> None:
    if status != 405:
        raise _fail(where, f"method not declared here (only {sorted(operations)}): expected 405")
    allow = {m.strip().lower() for m in headers.get("allow", "").split(",") if m.strip()}
    expected = operations | ({"head"} if "get" in operations else set())
    if allow != expected:
        raise _fail(where, f"Allow {headers.get('allow')!r} should list {sorted(expected)}")
    _check_error_body(status, headers, body, where, surface)


def _check_error_body(
    status: int, headers: httpx.Headers, body: bytes | None, where: str, surface: str
) -> None:
    """An error outside the operations: JSON in the envelope of the path's surface."""
    if _mimetype(headers) != "application/json":
        raise _fail(where, f"errors are application/json, got {_mimetype(headers)!r}")
    if body is None:
        return
    schema = "AnthropicErrorResponse" if surface == "anthropic" else "ErrorResponse"
    _validate(_schema(schema), _json(body, where), where)
    _check_error_row(status, body, where, surface)


def _check_error_row(status: int, body: bytes, where: str, surface: str = "openai") -> None:
    if surface == "anthropic":
        from . import anthropic_contract  # imported here: it imports this module

        anthropic_contract.check_error_type(status, body, where)
        return
    payload = _json(body, where)
    if isinstance(payload, dict) and "detail" in payload and "error" not in payload:
        return  # FastAPI's 422 (/v1/systemone): its declared schema was checked above
    error = payload.get("error", {})
    row = (status, error.get("type"), error.get("code"))
    if row not in _ERROR_ROWS:
        raise _fail(where, f"(status, type, code) {row} is not a row of mlxspec.errors.ERROR_TABLE")


def _json(body: bytes, where: str) -> Any:
    try:
        return json.loads(body)
    except ValueError as exc:
        raise _fail(where, f"body is not JSON: {body[:80]!r}") from exc


def _schema(name: str) -> SchemaPath:
    return _api().spec / "components" / "schemas" / name


def _schema_errors(schema: SchemaPath, value: Any) -> str | None:
    """openapi-core's verdict on ``value`` against ``schema``: ``None`` if valid."""
    validator = oas31_schema_validators_factory.create(_api().spec, schema)
    try:
        validator.validate(value)
    except InvalidSchemaValue as exc:
        return _describe(exc)
    return None


def _validate(schema: SchemaPath, value: Any, where: str) -> None:
    problem = _schema_errors(schema, value)
    if problem:
        raise _fail(where, problem)


def split_event_stream(body: bytes, where: str = "stream") -> list[str]:
    """Split an event stream into its ``data`` payloads, enforcing mlxspec's framing.

    Stricter than the WHATWG parser (HTML Living Standard, "Server-sent
    events", section 9.2.6): every event is exactly one ``data: <payload>``
    line followed by a blank line, with ``\\n`` line ends; blocks of ``:``
    comment lines (keep-alives) are skipped.

    Args:
        body (bytes): the whole stream, UTF-8.
        where (str): context for error messages. Default: ``"stream"``.

    Returns:
        list[str]: the payloads in order (``"[DONE]"`` included).

    Raises:
        ContractViolation: bad UTF-8, ``\\r``, a frame with other fields or
            several lines, or a stream that does not end with a blank line.
    """
    payloads = []
    for block in _event_blocks(body, where):
        if len(block) != 1 or not block[0].startswith("data: "):
            raise _fail(where, f"frame is not one 'data: ' line: {chr(10).join(block)[:120]!r}")
        payloads.append(block[0][len("data: ") :])
    return payloads


def split_named_event_stream(body: bytes, where: str = "stream") -> list[tuple[str, str]]:
    """Split a named-event stream (OpenAI Responses style) into ``(event, data)`` pairs.

    Same framing as :func:`split_event_stream`, except that every event is
    exactly an ``event: <name>`` line then one ``data: <payload>`` line.

    Raises:
        ContractViolation: as :func:`split_event_stream`, or a frame that is
            not exactly those two lines.
    """
    events = []
    for block in _event_blocks(body, where):
        if (
            len(block) != 2
            or not block[0].startswith("event: ")
            or not block[1].startswith("data: ")
        ):
            raise _fail(
                where, f"frame is not 'event: ' then 'data: ': {chr(10).join(block)[:120]!r}"
            )
        events.append((block[0][len("event: ") :], block[1][len("data: ") :]))
    return events


def _event_blocks(body: bytes, where: str) -> list[list[str]]:
    """The stream's frames as lists of lines, keep-alive comment blocks dropped."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(where, "event stream is not UTF-8") from exc
    if "\r" in text:
        raise _fail(where, "event stream frames end with \\n only")
    if not text.endswith("\n\n"):
        raise _fail(where, f"event stream does not end with a blank line: {text[-80:]!r}")
    blocks = [block.split("\n") for block in text[:-2].split("\n\n")]
    return [lines for lines in blocks if not all(line.startswith(":") for line in lines)]


def check_event_stream(event_schema: SchemaPath, body: bytes, where: str = "stream") -> None:
    """Check a whole event stream against a per-event schema of the document.

    Each payload is validated as ``{"data": payload}`` against ``event_schema``
    and, for JSON payloads, against the ``contentSchema`` of the first
    ``data.anyOf`` branch it satisfies. Order, from the generation routes'
    descriptions: ``[DONE]`` or an error frame ends the stream and nothing
    follows either; only the last chunk has a non-null ``finish_reason``, and
    before ``[DONE]`` it also carries ``usage``; all chunks share one ``id``;
    an error frame's ``type``/``code`` is a row of the error table.

    Args:
        event_schema (SchemaPath): e.g. the ``text/event-stream`` media type's schema.
        body (bytes): the whole stream.
        where (str): context for error messages. Default: ``"stream"``.

    Raises:
        ContractViolation: the first frame or ordering rule broken.
    """
    with event_schema.resolve() as resolved:
        named = "event" in resolved.contents.get("required", [])
    if named:
        _check_named_stream(event_schema, body, where)
        return
    payloads = split_event_stream(body, where)
    if not payloads:
        raise _fail(where, "event stream has no data frames")
    kinds = []
    for i, payload in enumerate(payloads):
        _validate(event_schema, {"data": payload}, f"{where} frame {i}")
        kinds.append(_frame_kind(event_schema, payload, f"{where} frame {i}"))
    for i, kind in enumerate(kinds[:-1]):
        if kind != "chunk":
            raise _fail(where, f"frame {i} ({kind}) must be the last, {len(kinds) - i - 1} follow")
    chunks = [json.loads(p) for p, k in zip(payloads, kinds, strict=True) if k == "chunk"]
    _check_chunk_order(chunks, kinds[-1], where)
    if kinds[-1] == "error":
        error = json.loads(payloads[-1])["error"]
        if (error.get("type"), error.get("code")) not in {row[1:] for row in _ERROR_ROWS}:
            raise _fail(where, f"in-band error {error} is not a row of mlxspec.errors.ERROR_TABLE")


def _check_named_stream(event_schema: SchemaPath, body: bytes, where: str) -> None:
    """A named-event stream (the event schema requires ``event``): every frame
    matches the schema, its JSON ``type`` repeats the ``event`` name, and
    ``sequence_number`` (where the events carry one) counts from 0 by 1."""
    events = split_named_event_stream(body, where)
    if not events:
        raise _fail(where, "event stream has no data frames")
    for i, (name, payload) in enumerate(events):
        _validate(event_schema, {"event": name, "data": payload}, f"{where} frame {i}")
        _frame_kind(event_schema, payload, f"{where} frame {i}")
        data = json.loads(payload)
        if data.get("type") != name:
            raise _fail(where, f"frame {i}: event {name!r} carries type {data.get('type')!r}")
        if "sequence_number" in data and data["sequence_number"] != i:
            raise _fail(
                where, f"frame {i}: sequence_number {data['sequence_number']}, expected {i}"
            )


def _check_named_event_stream(event_schema: SchemaPath, body: bytes, where: str) -> None:
    """An Anthropic stream: each ``event:``/``data:`` frame against the event
    schema and its ``contentSchema``, then the event grammar."""
    from . import anthropic_contract  # imported here: it imports this module

    events = []
    for i, (name, payload) in enumerate(anthropic_contract.split_named_events(body, where)):
        _validate(event_schema, {"event": name, "data": payload}, f"{where} frame {i}")
        _frame_kind(event_schema, payload, f"{where} frame {i}")  # checks the contentSchema
        events.append((name, json.loads(payload)))
    anthropic_contract.check_stream_order(events, where)


def _frame_kind(event_schema: SchemaPath, payload: str, where: str) -> str:
    """``done``, ``error`` or ``chunk``: the ``data.anyOf`` branch the payload satisfies."""
    failures = []
    for node in event_schema / "properties" / "data" / "anyOf":
        with node.resolve() as resolved:
            contents = resolved.contents
        if "const" in contents:
            if payload == contents["const"]:
                return "done"
            continue
        if "contentSchema" not in contents:
            continue
        try:
            problem = _schema_errors(node / "contentSchema", json.loads(payload))
        except ValueError:
            problem = "not JSON"
        if problem:
            failures.append(problem)
            continue
        ref = contents["contentSchema"].get("$ref", "")
        return "error" if ref.endswith("/ErrorResponse") else "chunk"
    raise _fail(where, f"{payload[:120]!r} matches no frame kind: {' | '.join(failures)}")


def _check_chunk_order(chunks: list[dict[str, Any]], last: str, where: str) -> None:
    if last == "chunk":
        raise _fail(where, "stream ended without data: [DONE] or an error frame")
    if len({c.get("id") for c in chunks}) > 1:
        raise _fail(where, "chunks of one stream must share one id")
    # Per choice index (n > 1 interleaves choices): finish_reason on that
    # choice's last chunk only; the stream's last chunk finishes the last choice.
    finished: dict[Any, list[int]] = {}
    last_seen: dict[Any, int] = {}
    for i, c in enumerate(chunks):
        for choice in c.get("choices", []):
            last_seen[choice.get("index")] = i
            if choice.get("finish_reason") is not None:
                finished.setdefault(choice.get("index"), []).append(i)
    if last == "done":
        for index, seen in last_seen.items():
            if finished.get(index) != [seen]:
                raise _fail(
                    where,
                    f"finish_reason must be set on choice {index}'s last chunk only, "
                    f"got {finished.get(index)}",
                )
        if not chunks or (len(chunks) - 1) not in {s[0] for s in finished.values()}:
            raise _fail(where, "the last chunk must carry a finish_reason")
        if not isinstance(chunks[-1].get("usage"), dict):
            raise _fail(where, "the last chunk before [DONE] must carry usage")
    elif finished:
        raise _fail(where, "a stream that ends in an error has no finish_reason")

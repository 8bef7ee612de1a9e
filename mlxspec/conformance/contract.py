"""Response-contract checks: any HTTP response against the OpenAPI document.

:func:`check_response` validates one response (status, declared headers, body)
with openapi-core 0.23 against ``mlxspec/openapi/openapi.yaml``. Event streams
are checked frame by frame by :mod:`mlxspec.conformance.stream_contract` (the
OpenAI-style and Responses streams) and :mod:`mlxspec.conformance.anthropic_contract`
(the Anthropic stream), and must be sent with ``Cache-Control: no-cache``.
Responses outside any operation follow the conventions of the document's
description: unknown paths answer 404 and undeclared methods 405 with
``Allow``, both with an ``ErrorResponse`` body, unless the request was refused
before routing (:data:`EDGE_KINDS`: a forged ``Host``, stalled or oversized
headers, a connection over the cap, unreadable framing); every error body
agrees with :data:`mlxspec.errors.ERROR_TABLE`. Paths of the Anthropic surface
(``/v1/messages...``) answer ``AnthropicErrorResponse`` bodies instead.

The stream splitters and :class:`ContractViolation` are re-exported here, so
callers need one import. :mod:`mlxspec.conformance.httpx_checks` runs these
checks on every response an httpx client (or the openai SDK over one) receives.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import yaml
from jsonschema_path import SchemaPath
from openapi_core.testing import MockRequest, MockResponse
from openapi_core.validation.response.validators import V31ResponseHeadersValidator

from mlxspec.conformance import anthropic_contract
from mlxspec.conformance.job_contract import check_job_stream
from mlxspec.conformance.schema_checks import (
    ERROR_ROWS,
    ContractViolation,
    api,
    describe,
    fail,
    parse_json,
    schema,
    validate,
)
from mlxspec.conformance.stream_contract import (
    check_event_stream,
    split_event_stream,
    split_named_event_stream,
)
from mlxspec.errors import ERROR_TABLE, surface_for_path
from mlxspec.http.aliases import path_aliases
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
#: Routes the app serves outside the document (Connexion's own spec routes),
#: with the parser of their body.
UNDOCUMENTED_GET = {
    "/openapi.json": json.loads,
    "/openapi.yaml": functools.partial(
        yaml.load, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    ),
}
#: Error kinds any request may get before it is routed (mlxspec.http.guard,
#: mlxspec.http.connections): operations declare them, paths outside them too.
EDGE_KINDS = frozenset(
    {
        "malformed_request",
        "host_not_allowed",
        "origin_not_allowed",
        "request_timeout",
        "headers_too_large",
        "too_many_connections",
    }
)
_EDGE_ROWS = {(ERROR_TABLE[k].status, ERROR_TABLE[k].code) for k in EDGE_KINDS}


@functools.cache
def _headers_validator() -> V31ResponseHeadersValidator:
    return V31ResponseHeadersValidator(api().spec)


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


@functools.cache
def _aliases() -> dict[str, str]:
    return path_aliases(load_spec())


def _deref(spec: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        target: Any = spec
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


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
    path = _aliases().get(path, path)  # an alias is answered as its path
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
        if path.endswith("/") and path != "/":  # a slashed path (an empty last parameter)
            _check_outside(method, path, status, headers, body_bytes, where)  # is not declared
            return
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
    openapi = api()
    mimetype = _mimetype(headers)
    response = MockResponse(body or b"", status, list(headers.multi_items()), mimetype)
    errors = list(_headers_validator().iter_errors(request, response))  # status and headers
    if errors:
        raise fail(where, "; ".join(describe(e) for e in errors))
    declared = openapi.spec / "paths" / template / request.method / "responses" / str(status)
    if "content" not in declared.str_keys():  # a status and headers only (a redirect, a 204)
        if body:
            raise fail(where, f"{status} declares no content but has a {len(body)}-byte body")
        return
    content = declared / "content"
    if mimetype not in content.str_keys():
        raise fail(where, f"Content-Type {mimetype!r} not declared: {list(content.str_keys())}")
    _check_stream_flag(request.body, content, mimetype, status, where)
    if body is None:
        return
    surface = surface_for_path(template)
    if mimetype == SSE:
        # openapi-core would read the stream as one event: check frame by frame.
        if surface == "anthropic":
            anthropic_contract.check_event_stream(content / SSE / "schema", body, where)
        elif surface == "lab":
            check_job_stream(body, where)
        else:
            check_event_stream(content / SSE / "schema", body, where)
        if headers.get("cache-control") != "no-cache":
            raise fail(where, "an event stream must be sent with Cache-Control: no-cache")
        return
    errors = list(openapi.iter_response_errors(request, response))
    if errors:
        raise fail(where, "; ".join(describe(e) for e in errors))
    # Error statuses carry an error envelope (the schemas require "error"), except
    # where the document declares another body (the flush route's 503 report).
    if status >= 400 and "error" in parse_json(body, where):
        _check_error_row(status, body, where, surface)


def _check_stream_flag(
    request_body: bytes, content: SchemaPath, mimetype: str, status: int, where: str
) -> None:
    """Where JSON and SSE are both declared, the request's ``stream`` picks one
    (the generation routes' 200 description). Where more types are declared
    (the transcription routes' ``response_format``), the format picks instead."""
    keys = set(content.str_keys())
    if status != 200 or keys != {"application/json", SSE}:
        return
    try:
        fields = json.loads(request_body or b"null")
    except ValueError:
        return
    streamed = isinstance(fields, dict) and fields.get("stream") is True
    expected = SSE if streamed else "application/json"
    if mimetype != expected:
        raise fail(where, f"stream={streamed} must answer {expected}, got {mimetype}")


def _check_outside(
    method: str,
    path: str,
    status: int,
    headers: httpx.Headers,
    body: bytes | None,
    where: str,
) -> None:
    """A path no operation declares: Connexion's spec routes, or a 404 (401 on a
    keyed server) ``ErrorResponse``; never a redirect (trailing slashes included)."""
    if _is_edge(status, headers, body, where, surface_for_path(path)):
        return
    if path in UNDOCUMENTED_GET:
        if method != "GET":
            _check_method_not_allowed({"get"}, status, headers, body, where, "openai")
        elif status != 200 or (body is not None and not _is_document(path, body)):
            raise fail(where, "the OpenAPI document route must answer 200 with the document")
        return
    if status not in (401, 404):
        raise fail(where, "a path outside the document must answer 404 (or 401 without a key)")
    _check_error_body(status, headers, body, where, surface_for_path(path))


def _is_document(path: str, body: bytes) -> bool:
    try:
        document = UNDOCUMENTED_GET[path](body)
    except (ValueError, yaml.YAMLError):
        return False
    return isinstance(document, dict) and isinstance(document.get("paths"), dict)


def _is_edge(
    status: int, headers: httpx.Headers, body: bytes | None, where: str, surface: str
) -> bool:
    """Whether this is a refusal before routing (:data:`EDGE_KINDS`), checked as such:
    an error body of the surface whose row is one of those kinds."""
    if status not in {row[0] for row in _EDGE_ROWS}:
        return False
    if body is not None and surface != "anthropic":
        payload = parse_json(body, where)
        error = payload.get("error") if isinstance(payload, dict) else None
        if (status, error.get("code") if isinstance(error, dict) else None) not in _EDGE_ROWS:
            return False
    _check_error_body(status, headers, body, where, surface)
    return True


def _check_method_not_allowed(
    operations: set[str],
    status: int,
    headers: httpx.Headers,
    body: bytes | None,
    where: str,
    surface: str,
) -> None:
    if status == 401:  # a keyed server checks the key before the method
        _check_error_body(status, headers, body, where, surface)
        return
    if _is_edge(status, headers, body, where, surface):
        return
    if status != 405:
        raise fail(
            where, f"method not declared here (only {sorted(operations)}): expected 405 (or 401)"
        )
    allow = {m.strip().lower() for m in headers.get("allow", "").split(",") if m.strip()}
    expected = operations | ({"head"} if "get" in operations else set())
    if allow != expected:
        raise fail(where, f"Allow {headers.get('allow')!r} should list {sorted(expected)}")
    _check_error_body(status, headers, body, where, surface)


def _check_error_body(
    status: int, headers: httpx.Headers, body: bytes | None, where: str, surface: str
) -> None:
    """An error outside the operations: JSON in the envelope of the path's surface."""
    if _mimetype(headers) != "application/json":
        raise fail(where, f"errors are application/json, got {_mimetype(headers)!r}")
    if body is None:
        return
    names = {"anthropic": "AnthropicErrorResponse", "lab": "LabErrorResponse"}
    validate(schema(names.get(surface, "ErrorResponse")), parse_json(body, where), where)
    _check_error_row(status, body, where, surface)


def _check_error_row(status: int, body: bytes, where: str, surface: str = "openai") -> None:
    if surface == "anthropic":
        anthropic_contract.check_error_type(status, body, where)
        return
    if surface == "lab":  # {ok: false, error: "<message>"}: no type or code to check
        validate(schema("LabErrorResponse"), parse_json(body, where), where)
        return
    payload = parse_json(body, where)
    if isinstance(payload, dict) and "detail" in payload and "error" not in payload:
        return  # FastAPI's 422 (/v1/systemone): its declared schema was checked above
    error = payload.get("error", {})
    row = (status, error.get("type"), error.get("code"))
    if row not in ERROR_ROWS:
        raise fail(where, f"(status, type, code) {row} is not a row of mlxspec.errors.ERROR_TABLE")

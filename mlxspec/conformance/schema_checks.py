"""The pieces every contract check shares: the document as openapi-core reads
it, its schemas, and the :class:`ContractViolation` each check raises.

:mod:`mlxspec.conformance.contract` (whole HTTP responses),
:mod:`mlxspec.conformance.stream_contract` (event streams) and
:mod:`mlxspec.conformance.anthropic_contract` (the Anthropic surface's rules)
build on these; none of them imports another check module from here.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from jsonschema_path import SchemaPath
from openapi_core import Config, OpenAPI
from openapi_core.deserializing.media_types.util import json_loads, plain_loads
from openapi_core.validation.schemas import oas31_schema_validators_factory
from openapi_core.validation.schemas.exceptions import InvalidSchemaValue

from mlxspec.errors import ERROR_TABLE
from mlxspec.openapi import load_spec

__all__ = [
    "ERROR_ROWS",
    "ContractViolation",
    "api",
    "describe",
    "fail",
    "parse_json",
    "schema",
    "schema_errors",
    "validate",
]

#: ``(status, type, code)`` of every row of :data:`mlxspec.errors.ERROR_TABLE`.
ERROR_ROWS = {(row.status, row.type, row.code) for row in ERROR_TABLE.values()}


class ContractViolation(AssertionError):
    """A response that breaks the contract of the OpenAPI document."""


#: Text media types the web chat's routes answer, read as text (openapi-core reads
#: only text/html and text/plain so; other types reach ``type: string`` as bytes).
_TEXT_TYPES = ("text/javascript", "text/css", "image/svg+xml")


@functools.cache
def api() -> OpenAPI:
    """The document as openapi-core's :class:`OpenAPI`, built once."""
    text = {media: plain_loads for media in _TEXT_TYPES}
    readers = {**text, "application/manifest+json": json_loads}
    return OpenAPI.from_dict(load_spec(), config=Config(extra_media_type_deserializers=readers))


def fail(where: str, message: str) -> ContractViolation:
    """A :class:`ContractViolation` that names where it happened.

    Args:
        where (str): the request or frame, e.g. ``"POST /v1/chat/completions -> 200"``.
        message (str): the rule broken.

    Returns:
        ContractViolation: to be raised by the caller.
    """
    return ContractViolation(f"{where}: {message}")


def describe(exc: BaseException) -> str:
    """One readable line per schema error found under an openapi-core exception.

    Args:
        exc (BaseException): an openapi-core validation error, or one whose
            ``__cause__`` chain leads to an :class:`InvalidSchemaValue`.

    Returns:
        str: ``body[...]: message`` parts joined by ``"; "``, or the exception's
        type and text where no schema error is under it.
    """
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


def parse_json(body: bytes, where: str) -> Any:
    """Decode a JSON body.

    Args:
        body (bytes): the body, UTF-8 JSON.
        where (str): context for the error message.

    Returns:
        Any: the decoded value.

    Raises:
        ContractViolation: the body is not JSON.
    """
    try:
        return json.loads(body)
    except ValueError as exc:
        raise fail(where, f"body is not JSON: {body[:80]!r}") from exc


def schema(name: str) -> SchemaPath:
    """The document's ``components/schemas/<name>``.

    Args:
        name (str): a schema name, e.g. ``"ErrorResponse"``.

    Returns:
        SchemaPath: the schema, references unresolved.
    """
    return api().spec / "components" / "schemas" / name


def schema_errors(node: SchemaPath, value: Any) -> str | None:
    """openapi-core's verdict on ``value`` against a schema of the document.

    Args:
        node (SchemaPath): the schema.
        value (Any): the decoded value.

    Returns:
        str | None: ``None`` if valid, else the errors as :func:`describe` words them.
    """
    validator = oas31_schema_validators_factory.create(api().spec, node)
    try:
        validator.validate(value)
    except InvalidSchemaValue as exc:
        return describe(exc)
    return None


def validate(node: SchemaPath, value: Any, where: str) -> None:
    """Require ``value`` to match a schema of the document.

    Args:
        node (SchemaPath): the schema.
        value (Any): the decoded value.
        where (str): context for the error message.

    Raises:
        ContractViolation: the schema errors, as :func:`describe` words them.
    """
    problem = schema_errors(node, value)
    if problem:
        raise fail(where, problem)

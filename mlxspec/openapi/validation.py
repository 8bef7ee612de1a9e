"""OpenAPI 3.1 support for Connexion 3, and OpenAI-shaped request validation.

Connexion 3.3 checks every OAS3 document against its bundled 3.0 meta-schema
and validates bodies with Draft 4 (spec-first/connexion#1396). This module is
the small, isolated adapter that fixes both:

* :func:`enable_openapi_31` makes Connexion validate 3.1 documents with
  ``openapi-spec-validator`` instead (3.0 documents keep the stock check);
* :class:`RequestBodyValidator` parses JSON strictly and validates with
  JSON Schema Draft 2020-12, raising :class:`~mlxspec.errors.ApiError`; a
  body with a ``Content-Encoding`` (``gzip``, ...) is a 415.

Two rules go beyond JSON Schema, matching ``mlx_lm.server``'s
``isinstance`` checks: ``integer`` rejects non-integral JSON numbers such as
``2.0``, and ``NaN``/``Infinity`` literals, and numbers that overflow a
double (``1e400``), are invalid JSON. A schema may
carry ``x-mlxspec-error`` (a message, or a map from JSON Schema keyword to
message) to give a field the reference's exact error text; ``{field}`` in such
a message becomes the field's dotted path (``questions.0.type``, ``body`` for
the root). A plain message covers every failure of the field, its absence
included; a map's ``"*"`` covers a value that is there, so a missing required
field reads ``<field> is required`` unless the map has a ``required`` key.
A request schema with ``x-mlxspec-param-style: dotted`` names fields that
way in ``param`` too (the decision routes' convention).
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from collections.abc import Iterable
from typing import Any

import jsonschema
from connexion.validators import JSONRequestBodyValidator, JSONResponseBodyValidator
from jsonschema.exceptions import ValidationError

from mlxspec.errors import ApiError
from mlxspec.openapi.schema_errors import best_error, describe

_patched = False


def enable_openapi_31() -> None:
    """Let Connexion accept ``openapi: 3.1.x`` documents (idempotent).

    Raises:
        connexion.exceptions.InvalidSpecification: at ``add_api`` time, for a
            3.1 document that ``openapi-spec-validator`` rejects.
    """
    global _patched
    if _patched:
        return
    import openapi_spec_validator
    from connexion.exceptions import InvalidSpecification
    from connexion.spec import OpenAPISpecification

    stock = OpenAPISpecification._validate_spec.__func__

    def _validate_spec(cls: type, spec: dict) -> None:
        if str(spec.get("openapi", "")).startswith("3.1"):
            try:
                openapi_spec_validator.validate(spec)
            except Exception as exc:  # the validator raises several error types
                raise InvalidSpecification(str(exc)) from exc
        else:
            stock(cls, spec)

    OpenAPISpecification._validate_spec = classmethod(_validate_spec)
    _patched = True


def _is_strict_integer(_checker: Any, instance: Any) -> bool:
    return isinstance(instance, int) and not isinstance(instance, bool)


@functools.lru_cache(maxsize=512)
def ecma_pattern(pattern: str) -> re.Pattern[str]:
    r"""``pattern`` (a JSON Schema ``pattern``, an ECMA-262 regular expression)
    compiled for Python's ``re`` with ECMA-262's ``$``: the end of the input.

    JSON Schema 2020-12 (validation, section 6.3.3) gives patterns ECMA-262
    semantics, where ``$`` without the multiline flag matches only at the end;
    Python's ``$`` also matches before a final newline, so ``^[a-z]{1,64}$``
    would accept ``"name\n"``. Each ``$`` outside a character class and not
    escaped becomes ``\Z``.

    Raises:
        re.error: the pattern does not compile.
    """
    out, in_class, i = [], False, 0
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            out.append(pattern[i : i + 2])
            i += 2
            continue
        if ch == "[":
            in_class = True
        elif ch == "]":
            in_class = False
        out.append("\\Z" if ch == "$" and not in_class else ch)
        i += 1
    return re.compile("".join(out))


def _pattern(validator: Any, pattern: str, instance: Any, schema: dict) -> Any:
    """The ``pattern`` keyword with ECMA-262's ``$`` (:func:`ecma_pattern`);
    otherwise as jsonschema's own (same message)."""
    if validator.is_type(instance, "string") and not ecma_pattern(pattern).search(instance):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_StrictDraft202012 = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    validators={"pattern": _pattern},
    type_checker=jsonschema.Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", _is_strict_integer
    ),
)

# id(schema) -> (schema, validator); keeping the schema alive keeps its id unique.
_VALIDATORS: dict[int, tuple[dict, Any]] = {}


def validator_for(schema: dict) -> Any:
    """A cached strict Draft 2020-12 validator for ``schema`` (refs already inlined)."""
    hit = _VALIDATORS.get(id(schema))
    if hit is None:
        hit = (schema, _StrictDraft202012(schema))
        _VALIDATORS[id(schema)] = hit
    return hit[1]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"invalid JSON literal {name}")


class _OutOfRange(ValueError):
    """A JSON number beyond the float range (``1e400``)."""


#: The largest finite float, for integers: beyond it ``float(n)`` overflows.
_FLOAT_MAX = int(sys.float_info.max)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # Python reads 1e400 as inf, which no field can take
        raise _OutOfRange(text)
    return value


def _float_range_int(text: str) -> int:
    value = int(text)
    if abs(value) > _FLOAT_MAX:  # a float field would overflow converting it
        raise _OutOfRange(text)
    return value


#: A ``\\uD800``-``\\uDFFF`` escape: the only way a surrogate gets into a string.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json_body(raw: bytes) -> Any:
    """Parse a request body as strict JSON.

    Strings holding an unpaired UTF-16 surrogate escape (``"\\ud800"``) are
    refused: they are not Unicode text (RFC 8259 section 8.2), and tokenizers
    raise on them. So are numbers beyond the double range (``1e400``, which
    Python would read as infinity, like the ``Infinity`` literal refused here;
    RFC 8259 section 6 leaves such numbers to the implementation).

    Returns:
        The decoded value, or ``None`` for an empty body.

    Raises:
        ApiError: ``invalid_json`` with the message ``invalid JSON body``
            (``invalid JSON body: unpaired UTF-16 surrogate`` and ``invalid JSON
            body: number out of range`` for the above, ``invalid JSON body: nested
            too deeply`` past Python's recursion limit).
    """
    # A UTF-8 BOM, which RFC 8259 section 8.1 lets parsers ignore.
    raw = raw.removeprefix(b"\xef\xbb\xbf")
    if not raw.strip():
        return None
    try:
        value = json.loads(
            raw.decode("utf-8"),
            parse_constant=_reject_constant,
            parse_float=_finite_float,
            parse_int=_float_range_int,
        )
    except _OutOfRange as exc:
        raise ApiError("invalid_json", "invalid JSON body: number out of range") from exc
    except RecursionError as exc:  # valid JSON, deeper than Python's parser can follow
        raise ApiError("invalid_json", "invalid JSON body: nested too deeply") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError("invalid_json", "invalid JSON body") from exc
    if _SURROGATE_ESCAPE.search(raw):
        try:
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ApiError("invalid_json", "invalid JSON body: unpaired UTF-16 surrogate") from exc
    return value


def format_path(path: Iterable[Any]) -> str | None:
    """Render a JSON path as ``messages[0].role``; ``None`` for the root."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or None


def dotted_path(path: Iterable[Any]) -> str:
    """Render a JSON path as ``questions.0.type``; ``body`` for the root."""
    return ".".join(str(part) for part in path) or "body"


def error_for(error: ValidationError, dotted: bool = False) -> ApiError:
    """Turn the best jsonschema error into a 400 naming the field.

    Args:
        error (ValidationError): from :func:`~mlxspec.openapi.schema_errors.best_error`.
        dotted (bool): name the field as :func:`dotted_path` does instead of
            :func:`format_path`. Default: ``False``.

    Returns:
        ApiError: ``invalid_request`` with ``param`` set to the field path.
    """
    path = list(error.absolute_path)
    schema = error.schema if isinstance(error.schema, dict) else {}
    if error.validator == "required":
        missing = next(p for p in error.validator_value if p not in error.instance)
        path.append(missing)
        props = schema.get("properties", {})
        schema = props.get(missing, {}) if isinstance(props, dict) else {}
    param = dotted_path(path) if dotted else format_path(path)
    custom = _custom_message(error, schema)
    if custom is not None:
        message = custom.replace("{field}", dotted_path(path))
        return ApiError("invalid_request", message, param=param)
    if error.validator == "required":
        return ApiError("invalid_request", f"{param} is required", param=param)
    where = f"'{param}'" if param else "request body"
    return ApiError("invalid_request", describe(error, where), param=param)


def _custom_message(error: ValidationError, schema: dict) -> str | None:
    """The nearest ``x-mlxspec-error`` at the failing location (``anyOf`` parents included).

    A mapping is looked up by the failing keyword, then by the keyword of the
    level that carries it, then ``"*"``, except for a missing field: ``"*"``
    speaks of a value's shape, and a field that is not there has none (it gets
    the generic ``<field> is required``).
    """
    fallback = () if error.validator == "required" else ("*",)
    level: ValidationError | None = error
    while level is not None:
        here = schema if level is error else level.schema
        custom = here.get("x-mlxspec-error") if isinstance(here, dict) else None
        if isinstance(custom, str):
            return custom
        if isinstance(custom, dict):
            for key in (error.validator, level.validator, *fallback):
                if isinstance(custom.get(str(key)), str):
                    return custom[str(key)]
        level = level.parent
    return None


def refuse_content_encoding(headers: Iterable[tuple[bytes, bytes]]) -> None:
    """Refuse a request body sent with a content coding (``gzip``, ``br``, ...).

    Bodies are read as plain JSON only: the SDKs never compress requests, and
    decoding would need a cap on the decoded size (a small gzip body can
    inflate a thousandfold). RFC 9110 section 15.5.16 answers an unsupported
    coding with 415 and ``Accept-Encoding`` listing the codings taken.

    Args:
        headers (Iterable[tuple[bytes, bytes]]): the ASGI scope's headers.

    Raises:
        ApiError: ``unsupported_media_type`` naming the first coding other than
            ``identity``, with ``Accept-Encoding: identity``.
    """
    for name, value in headers:
        if name.lower() != b"content-encoding":
            continue
        codings = [c.strip() for c in value.decode("latin-1").split(",")]
        coding = next((c for c in codings if c and c.lower() != "identity"), None)
        if coding is not None:
            raise ApiError(
                "unsupported_media_type",
                f"Content-Encoding '{coding}' is not supported: send the request body "
                "uncompressed (identity)",
                headers={"Accept-Encoding": "identity"},
            )


def _no_body(scope: Any) -> bool:
    """Whether Connexion treats the request as bodiless: a ``Content-Length`` of 0
    or none (its rule; a malformed length is left to Connexion)."""
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            try:
                return int(value) == 0
            except ValueError:
                return False
    return True


class RequestBodyValidator(JSONRequestBodyValidator):
    """Connexion body validator: plain (unencoded) strict JSON, Draft 2020-12,
    OpenAI-shaped errors.

    Register under ``validator_map["body"]`` for ``*/*json`` in ``add_api``.
    """

    async def wrap_receive(self, receive: Any, *, scope: Any) -> Any:
        """Connexion's, except that a missing body gets the same 400 as ``null``
        (Connexion answers an empty required body with its own "RequestBody is
        required" before :meth:`_parse` runs)."""
        if self._required and self._schema.get("default") is None and _no_body(scope):
            raise ApiError("invalid_request", "request body is required")
        return await super().wrap_receive(receive, scope=scope)

    async def _parse(self, stream: Any, scope: Any) -> Any:
        refuse_content_encoding(scope.get("headers", []))
        return parse_json_body(b"".join([chunk async for chunk in stream]))

    def _validate(self, body: Any) -> dict | None:
        if body is None:
            raise ApiError("invalid_request", "request body is required")
        error = best_error(validator_for(self._schema).iter_errors(body))
        if error is not None:
            raise error_for(error, self._schema.get("x-mlxspec-param-style") == "dotted")
        return None


class ResponseBodyValidator(JSONResponseBodyValidator):
    """Connexion response validator using Draft 2020-12 (Draft 4 ignores ``const``)."""

    @property
    def validator(self) -> Any:
        """The cached strict Draft 2020-12 validator for this response schema."""
        return validator_for(self._schema)

"""Plain-language text for JSON Schema errors: the generic half of a 400.

Fields without an ``x-mlxspec-error`` get their message from here. jsonschema's
own messages print the instance as a Python ``repr`` (``True is not of type
'integer'``, ``{'type': 'json_schema'} is not valid under any of the given
schemas``); a client sent JSON, so the value is shown as JSON (``true``,
``"5"``, ``null``) and cut to :data:`SHOWN_CHARS` characters, and a type error
reads as OpenAI's API words it ("Invalid type for 'max_tokens': expected an
integer, but got a boolean instead.").

:func:`best_error` also looks inside a failed ``anyOf``/``oneOf`` before the
text is written: a tagged union (OpenAI's ``{"type": ...}`` objects) is reported by the
branch whose tag matched, and a value that matches none of the branches' types
says which types were allowed.
"""

from __future__ import annotations

import heapq
import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from jsonschema.exceptions import ValidationError, relevance

__all__ = ["SHOWN_CHARS", "best_error", "describe", "first_relevance", "json_kind", "shown"]

#: The most characters of a bad value an error message repeats.
SHOWN_CHARS = 60

#: JSON Schema type names as a sentence names them.
_NAMES = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "object": "an object",
    "array": "an array",
    "null": "null",
}


def first_relevance(error: ValidationError) -> tuple:
    """jsonschema's ``relevance`` key for ``best_match`` without its comparison of
    sibling paths: with ``max`` it picks the *last* bad member (``prompt[1]`` of
    ``[1.5, 2]``), so ties now go to the first error found, the instance's first
    bad member. Deeper errors and stronger keywords still win (jsonschema's rules).

    Args:
        error (ValidationError): one of the errors ``iter_errors`` yields.

    Returns:
        tuple: the sort key ``best_match`` maximises.
    """
    depth, _, *rest = relevance(error)
    return (depth, *rest)


def shown(value: Any) -> str:
    """``value`` as compact JSON, cut to :data:`SHOWN_CHARS` characters (``...`` marks a cut)."""
    text = json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
    return text if len(text) <= SHOWN_CHARS else text[: SHOWN_CHARS - 3] + "..."


def json_kind(value: Any) -> str:
    """The JSON type of a parsed value as a sentence names it (``"a boolean"``, ``"null"``).

    An integral number is ``"an integer"``; ``2.0`` is ``"a number"`` (the strict
    ``integer`` rule of :mod:`mlxspec.openapi.validation`).
    """
    if value is None:
        return _NAMES["null"]
    if isinstance(value, bool):
        return _NAMES["boolean"]
    if isinstance(value, int):
        return _NAMES["integer"]
    if isinstance(value, float):
        return _NAMES["number"]
    if isinstance(value, str):
        return _NAMES["string"]
    return _NAMES["array"] if isinstance(value, list) else _NAMES["object"]


def _either(types: list[str]) -> str:
    names = [_NAMES.get(t, t) for t in dict.fromkeys(types)]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def _type_names(value: Any) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def describe(error: ValidationError, where: str) -> str:
    """The message of a schema error that has no ``x-mlxspec-error``.

    Args:
        error (ValidationError): the error :func:`best_error` chose.
        where (str): the field as the message names it (``'max_tokens'``, with
            quotes) or ``"request body"`` for the root.

    Returns:
        str: e.g. ``Invalid type for 'seed': expected an integer or null, but got
        a number instead.`` or ``Invalid value for 'encoding_format': "hex" is
        not one of "float", "base64", null``.
    """
    kind, value, instance = error.validator, error.validator_value, error.instance
    types = _type_names(value) if kind == "type" else None
    if kind == "anyOf":
        types = _branch_types(error)
    if types:
        expected = _either(types)
        return (
            f"Invalid type for {where}: expected {expected}, but got {json_kind(instance)} instead."
        )
    if kind == "enum":
        allowed = ", ".join(shown(v) for v in value)
        return f"Invalid value for {where}: {shown(instance)} is not one of {allowed}"
    if kind == "const":
        return f"Invalid value for {where}: expected {shown(value)}, got {shown(instance)}"
    if kind == "additionalProperties" and isinstance(instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        extra = [shown(k) for k in instance if k not in known]
        noun = "field" if len(extra) == 1 else "fields"
        return f"Invalid value for {where}: unexpected {noun} {', '.join(extra)}"
    text = error.message
    if text.startswith(repr(instance)):  # jsonschema's "<repr> is too long" and kin
        text = shown(instance) + text[len(repr(instance)) :]
    return f"Invalid value for {where}: {text}"


def best_error(errors: Iterable[ValidationError]) -> ValidationError | None:
    """The error that best explains why a value failed its schema.

    jsonschema's :func:`~jsonschema.exceptions.best_match` (with
    :func:`first_relevance`), except inside a failed ``anyOf``/``oneOf``: there
    branches that want another JSON type than the value's (the ``null`` of a
    nullable field, the string of a string-or-array) are set aside, and for an
    object with a ``"type"`` member so are branches whose ``type`` tag refused
    it (OpenAI's tagged unions). When one branch is left, the search goes on in
    it, so ``{"type": "json_schema"}`` is told what ``json_schema`` lacks, and
    ``{"type": "image"}`` is not told that its type should be ``"text"``.
    Otherwise jsonschema's own rule picks.

    Args:
        errors (Iterable[ValidationError]): what ``iter_errors`` yields.

    Returns:
        ValidationError | None: the error to report; ``None`` for no errors.
    """
    errors = list(errors)
    best = max(errors, key=first_relevance, default=None)
    while best is not None and best.context:
        left = _branches_left(best) if best.validator in ("anyOf", "oneOf") else []
        if len(left) == 1:
            best = max(left[0], key=first_relevance)
            continue
        # jsonschema's rule: descend to the least relevant sub-error unless tied
        smallest = heapq.nsmallest(2, best.context, key=first_relevance)
        if len(smallest) == 2 and first_relevance(smallest[0]) == first_relevance(smallest[1]):
            break
        best = smallest[0]
    return None if best is None else _tag_first(best, errors)


def _tag_first(best: ValidationError, errors: list[ValidationError]) -> ValidationError:
    """An object's ``type`` tag is reported before the members the tag asks for.

    When ``best`` says an object lacks a member, and the object's ``"type"`` is
    itself missing (``tool_choice: {}``) or refused (``{"type": "text"}`` where
    only ``"json_schema"`` is taken), that error is the one to report: the tag
    decides which members are required.
    """
    if best.validator != "required" or not isinstance(best.instance, dict):
        return best
    where = list(best.absolute_path)
    # only errors of the same union branch: another branch has its own tag
    siblings = errors
    if best.parent is not None:
        branch = best.relative_schema_path[0]
        siblings = [e for e in best.parent.context if e.relative_schema_path[0] == branch]
    for error in _walk(siblings):
        path = list(error.absolute_path)
        if "type" not in best.instance:
            if error.validator == "required" and path == where and "type" in error.validator_value:
                return error
        elif path == [*where, "type"] and error.validator in ("const", "enum", "type"):
            return error
    return best


def _walk(errors: Iterable[ValidationError]) -> Iterable[ValidationError]:
    """Every error and, depth first, the errors of the branches it holds (a
    ``$ref`` or ``allOf`` level adds no context; a nested union does)."""
    for error in errors:
        yield error
        yield from _walk(error.context or ())


def _branches_left(error: ValidationError) -> list[list[ValidationError]]:
    """The failed union's branches that fit the value's JSON type and ``type`` tag."""
    branches: dict[Any, list[ValidationError]] = defaultdict(list)
    for sub in error.context:
        branches[sub.relative_schema_path[0]].append(sub)
    left = [
        errs
        for errs in branches.values()
        if not any(e.validator == "type" and not e.relative_path for e in errs)
    ]
    if isinstance(error.instance, dict) and "type" in error.instance:
        tagged = [errs for errs in left if not any(list(e.relative_path) == ["type"] for e in errs)]
        left = tagged or left
    return left


def _branch_types(error: ValidationError) -> list[str] | None:
    """The types an ``anyOf`` allows when every branch failed only on ``type``.

    Returns:
        list[str] | None: the allowed type names in branch order, or ``None``
        when some branch failed on anything else (the generic text is kept).
    """
    types: list[str] = []
    for sub in error.context:
        if sub.validator != "type" or list(sub.relative_path):
            return None
        types.extend(_type_names(sub.validator_value))
    return types or None

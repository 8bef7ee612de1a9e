"""The OpenAPI 3.1 adapter and request validation, as pure unit tests."""

from __future__ import annotations

import pytest
from jsonschema.exceptions import best_match

from mlxspec.errors import ApiError, openai_error_body
from mlxspec.validation import (
    enable_openapi_31,
    error_for,
    format_path,
    parse_json_body,
    validator_for,
)

SCHEMA = {
    "type": "object",
    "required": ["messages"],
    "properties": {
        "messages": {
            "type": "array",
            "minItems": 1,
            "x-mlxspec-error": {"minItems": "messages required", "required": "messages required"},
            "items": {"type": "object", "properties": {"role": {"enum": ["user"]}}},
        },
        "n": {"type": "integer"},
        "top": {
            "type": ["integer", "null"],
            "minimum": -1,
            "maximum": 11,
            "x-mlxspec-error": {"minimum": "top must be at least 0"},
        },
        "pick": {
            "anyOf": [{"const": -1}, {"type": "integer", "minimum": 0}],
            "x-mlxspec-error": "pick is wrong",
        },
    },
}


def first_error(body: dict) -> ApiError | None:
    err = best_match(validator_for(SCHEMA).iter_errors(body))
    return None if err is None else error_for(err)


def test_integer_rejects_integral_floats_and_bools() -> None:
    assert first_error({"messages": [{}], "n": 2}) is None
    for bad in (2.0, True, "2"):
        err = first_error({"messages": [{}], "n": bad})
        assert err is not None and err.param == "n"


def test_custom_messages_by_keyword() -> None:
    assert first_error({"messages": []}).message == "messages required"
    err = first_error({})
    assert (err.message, err.param) == ("messages required", "messages")
    assert first_error({"messages": [{}], "top": -2}).message == "top must be at least 0"
    # A keyword without a custom message falls back to the generic text.
    assert (
        "12 is greater than the maximum of 11" in first_error({"messages": [{}], "top": 12}).message
    )


def test_custom_message_found_through_any_of() -> None:
    err = first_error({"messages": [{}], "pick": -5})
    assert (err.message, err.param) == ("pick is wrong", "pick")


def test_nested_path_is_named() -> None:
    err = first_error({"messages": [{"role": "user"}, {"role": "bot"}]})
    assert err.param == "messages[1].role"
    assert err.message.startswith("Invalid value for 'messages[1].role'")


def test_format_path() -> None:
    assert format_path([]) is None
    assert format_path(["a", 0, "b", 2]) == "a[0].b[2]"


@pytest.mark.parametrize(
    "raw", [b"{", b"NaN", b'{"a": Infinity}', b"\xff\xfe", b'{"a": -Infinity}']
)
def test_invalid_json(raw: bytes) -> None:
    with pytest.raises(ApiError) as err:
        parse_json_body(raw)
    assert openai_error_body(err.value)["error"] == {
        "message": "invalid JSON body",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_json",
    }
    assert err.value.status == 400


def test_empty_body_is_none_and_values_parse() -> None:
    assert parse_json_body(b"  ") is None
    assert parse_json_body(b'{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}


def test_openapi_31_documents_are_checked() -> None:
    from connexion.exceptions import InvalidSpecification
    from connexion.spec import Specification

    enable_openapi_31()
    enable_openapi_31()  # idempotent
    good = {"openapi": "3.1.0", "info": {"title": "t", "version": "1"}, "paths": {}}
    Specification.load(good)
    bad = {"openapi": "3.1.0", "info": {"title": "t"}, "paths": {}}
    with pytest.raises(InvalidSpecification):
        Specification.load(bad)


@pytest.mark.parametrize("depth", [3_000, 100_000])
def test_nesting_past_the_recursion_limit_is_invalid_json(depth: int) -> None:
    # valid JSON that Python's parser cannot follow: the message says why
    deep = b'{"x": ' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(ApiError) as err:
        parse_json_body(deep)
    assert (err.value.status, err.value.kind, err.value.message) == (
        400,
        "invalid_json",
        "invalid JSON body: nested too deeply",
    )
    shallow = parse_json_body(b'{"x": ' + b"[" * 500 + b"]" * 500 + b"}")["x"]
    levels = 0
    while shallow:  # 500 nested lists parse; the innermost is empty
        shallow, levels = shallow[0], levels + 1
    assert levels == 499

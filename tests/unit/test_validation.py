"""The OpenAPI 3.1 adapter and request validation, as pure unit tests."""

from __future__ import annotations

import pytest

from mlxspec.errors import ApiError, openai_error_body
from mlxspec.openapi.schema_errors import best_error
from mlxspec.openapi.validation import (
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
    err = best_error(validator_for(SCHEMA).iter_errors(body))
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
        first_error({"messages": [{}], "top": 12}).message
        == "Invalid value for 'top': 12 is greater than the maximum of 11"
    )


def test_a_missing_field_is_required_unless_its_message_says_otherwise() -> None:
    def missing(message: object) -> tuple[str, str | None]:
        field = {"type": "string", "x-mlxspec-error": message}
        schema = {"type": "object", "required": ["x"], "properties": {"x": field}}
        err = error_for(best_error(validator_for(schema).iter_errors({})))
        return err.message, err.param

    # "*" speaks of a value that is there; a missing one is required
    assert missing({"*": "x must be a string"}) == ("x is required", "x")
    assert missing({"type": "x must be a string"}) == ("x is required", "x")
    # a message for absence, or one message for every failure, still applies
    assert missing({"required": "send x", "*": "x must be a string"}) == ("send x", "x")
    assert missing("{field}: must be a string") == ("x: must be a string", "x")


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


UNIONS = {
    "type": "object",
    "properties": {
        "fmt": {
            "anyOf": [
                {
                    "type": "object",
                    "required": ["type"],
                    "properties": {"type": {"enum": ["plain", "schema"]}},
                    "if": {"properties": {"type": {"const": "schema"}}},
                    "then": {"required": ["name"], "properties": {"name": {"type": "string"}}},
                },
                {"type": "null"},
            ]
        },
        "part": {
            "oneOf": [
                {
                    "type": "object",
                    "properties": {"type": {"const": "text"}, "text": {"type": "string"}},
                    "required": ["type", "text"],
                },
                {
                    "type": "object",
                    "properties": {
                        "type": {"const": "image"},
                        "url": {"type": "string", "maxLength": 8},
                    },
                    "required": ["type", "url"],
                },
            ]
        },
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "integer"}}]},
        "name": {"type": "string", "maxLength": 4},
        "kind": {"enum": ["float", "base64", None]},
        "role": {"const": "user"},
        "flag": {"type": ["boolean", "null"]},
        "closed": {"type": "object", "properties": {"a": {}}, "additionalProperties": False},
        "single": {
            "type": "object",
            "required": ["type", "schema"],
            "properties": {"type": {"const": "json_schema"}, "schema": {"type": "object"}},
        },
    },
}


def union_error(body: dict) -> tuple[str, str | None]:
    err = error_for(best_error(validator_for(UNIONS).iter_errors(body)))
    return err.message, err.param


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # JSON words and JSON values, never Python's (True, None, {'a': 1})
        (
            {"flag": 1},
            "Invalid type for 'flag': expected a boolean or null, but got an integer instead.",
        ),
        ({"name": True}, "Invalid type for 'name': expected a string, but got a boolean instead."),
        ({"name": 2.5}, "Invalid type for 'name': expected a string, but got a number instead."),
        (
            {"name": {"a": 1}},
            "Invalid type for 'name': expected a string, but got an object instead.",
        ),
        ({"name": [None]}, "Invalid type for 'name': expected a string, but got an array instead."),
        (
            {"kind": "hex"},
            """Invalid value for 'kind': "hex" is not one of "float", "base64", null""",
        ),
        ({"role": "bot"}, 'Invalid value for \'role\': expected "user", got "bot"'),
        (
            {"closed": {"a": 1, "b": 2, "c": 3}},
            'Invalid value for \'closed\': unexpected fields "b", "c"',
        ),
        ({"name": "abcdef"}, """Invalid value for 'name': "abcdef" is too long"""),
        # a long value is cut
        (
            {"name": "x" * 200},
            f"""Invalid value for 'name': "{"x" * 56}... is too long""",
        ),
        # no branch takes the value's JSON type: the types the union allows
        (
            {"input": {"a": 1}},
            "Invalid type for 'input': expected a string or an array, but got an object instead.",
        ),
        # a branch of the right type explains itself
        (
            {"input": [1, "2"]},
            "Invalid type for 'input[1]': expected an integer, but got a string instead.",
        ),
    ],
)
def test_generic_messages_speak_json(body: dict, expected: str) -> None:
    assert union_error(body)[0] == expected


def test_tagged_union_reports_the_branch_its_tag_picks() -> None:
    # the nullable anyOf's null branch is set aside, then the tag's `then` speaks
    assert union_error({"fmt": {"type": "schema"}}) == ("fmt.name is required", "fmt.name")
    assert union_error({"fmt": {"type": "schema", "name": 3}}) == (
        "Invalid type for 'fmt.name': expected a string, but got an integer instead.",
        "fmt.name",
    )
    assert union_error({"part": {"type": "image", "url": "https://example.com/x.png"}}) == (
        """Invalid value for 'part.url': "https://example.com/x.png" is too long""",
        "part.url",
    )
    assert union_error({"part": {"type": "text"}}) == ("part.text is required", "part.text")
    # a tag no branch takes: the union itself is reported, its value as JSON
    message, param = union_error({"part": {"type": "audio"}})
    assert (message, param) == (
        'Invalid value for \'part\': {"type": "audio"} is not valid under any of the given schemas',
        "part",
    )


def test_the_tag_is_reported_before_what_it_asks_for() -> None:
    # missing: the tag, not the members a tag would require
    assert union_error({"fmt": {}}) == ("fmt.type is required", "fmt.type")
    assert union_error({"single": {}}) == ("single.type is required", "single.type")
    # refused: the tag, not the members the right tag would require
    assert union_error({"single": {"type": "text"}}) == (
        'Invalid value for \'single.type\': expected "json_schema", got "text"',
        "single.type",
    )
    # right tag: what it asks for
    assert union_error({"single": {"type": "json_schema"}}) == (
        "single.schema is required",
        "single.schema",
    )

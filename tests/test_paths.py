"""The document's paths as the router answers them (``mlxspec.paths``): a 404 for
a mistyped base URL names the route the client meant, in that route's error
envelope; concrete paths shadowed by a template are known."""

from __future__ import annotations

import httpx
import pytest

from mlxspec.openapi import served_spec
from mlxspec.paths import shadowed_methods, suggest_path

SPEC = served_spec()


@pytest.mark.parametrize(
    ("method", "path", "guess"),
    [
        ("POST", "/chat/completions", "/v1/chat/completions"),  # openai SDK without /v1
        ("GET", "/models", "/v1/models"),
        ("HEAD", "/models", "/v1/models"),
        ("POST", "/v1/v1/messages", "/v1/messages"),  # anthropic SDK with /v1
        ("POST", "/v1/v1/messages/count_tokens", "/v1/messages/count_tokens"),
        ("GET", "/v1/v1/responses/resp_1", "/v1/responses/resp_1"),
        # the guess must take the method: POST there would be a 405
        ("POST", "/v1/v1/responses/resp_1", None),
        ("GET", "/chat/completions", None),
        ("GET", "/v1/nothing", None),
        ("GET", "/nothing", None),
        ("GET", "/v1/v1/nothing", None),
        ("GET", "/v1", None),
    ],
)
def test_suggest_path(method: str, path: str, guess: str | None) -> None:
    assert suggest_path(SPEC)(path, method) == guess


def test_shadowed_paths() -> None:
    assert shadowed_methods(SPEC) == {"/v1/responses/input_tokens": {"POST"}}


def test_a_doubled_v1_gets_the_hint_in_anthropic_shape(client: httpx.Client) -> None:
    r = client.post("/v1/v1/messages", json={})
    assert r.status_code == 404
    assert r.json() == {
        "type": "error",
        "error": {
            "type": "not_found_error",
            "message": "not found: did you mean /v1/messages? (check the client's base URL)",
        },
    }


def test_a_missing_v1_gets_the_hint_in_openai_shape(client: httpx.Client) -> None:
    r = client.post("/chat/completions", json={})
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "not found: did you mean /v1/chat/completions? (check the client's "
            "base URL)",
            "type": "not_found_error",
            "param": None,
            "code": None,
        }
    }
    plain = client.get("/v1/nothing")
    assert (plain.status_code, plain.json()["error"]["message"]) == (404, "not found")

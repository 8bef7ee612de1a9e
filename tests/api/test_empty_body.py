"""A missing request body reads like a ``null`` one, on every surface (a fresh user
saw Connexion's own "RequestBody is required" for an empty body)."""

from __future__ import annotations

import httpx
import pytest

JSON = {"content-type": "application/json"}


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/v1/responses"])
@pytest.mark.parametrize("content", [b"", b"null"])
def test_missing_or_null_body_is_one_openai_400(
    client: httpx.Client, path: str, content: bytes
) -> None:
    r = client.post(path, content=content, headers=JSON)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["message"] == "request body is required"
    assert r.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("content", [b"", b"null"])
def test_missing_or_null_body_is_one_anthropic_400(client: httpx.Client, content: bytes) -> None:
    r = client.post("/v1/messages", content=content, headers=JSON)
    assert r.status_code == 400, r.text
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "request body is required"},
    }

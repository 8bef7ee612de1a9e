"""POST headers as clients really send them (``app._post_headers``): media types
in any letter case or with spaces around ``;`` (RFC 9110 section 8.3.1), chunked
uploads without a ``Content-Length``, and a UTF-8 BOM before the JSON. Each used
to fail: a 500 (Connexion skipped validation for ``application/JSON`` and the
handler got bytes), a 415, a 400 "request body is required" and a 400 "invalid
JSON body". Live server on the tiny model; ``client`` checks every response
against the document."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

NO_EOS = {"2": -1e9}
CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
COMPLETION = ("/v1/completions", {"prompt": "hello"})
MESSAGES = ("/v1/messages", {"messages": [{"role": "user", "content": "hi"}]})
TYPES = [
    "application/JSON",
    "APPLICATION/JSON; CHARSET=UTF-8",
    "Application/json; charset=utf-8",
    "application/json ; charset=utf-8",
    "application/json;charset=utf-8",
]
ROUTES = pytest.mark.parametrize(
    ("path", "base"), [CHAT, COMPLETION, MESSAGES], ids=["chat", "cmpl", "msg"]
)
JSON = {"content-type": "application/json"}


def _body(base: dict, **more) -> dict:
    return {**base, "max_tokens": 3, "temperature": 0, **more}


def _text(path: str, answer: dict) -> str:
    if path == "/v1/messages":
        return answer["content"][0]["text"]
    choice = answer["choices"][0]
    return choice["message"]["content"] if "message" in choice else choice["text"]


@pytest.mark.parametrize("content_type", TYPES)
@ROUTES
def test_any_case_and_spacing_of_the_json_media_type_is_json(
    client: httpx.Client, path: str, base: dict, content_type: str
) -> None:
    raw = json.dumps(_body(base)).encode()
    plain = client.post(path, content=raw, headers={"content-type": "application/json"})
    other = client.post(path, content=raw, headers={"content-type": content_type})
    assert (plain.status_code, other.status_code) == (200, 200), other.text
    assert _text(path, other.json()) == _text(path, plain.json())


@pytest.mark.parametrize("content_type", TYPES[:2])
def test_the_body_is_still_validated_under_another_case(
    client: httpx.Client, content_type: str
) -> None:
    raw = json.dumps(_body(CHAT[1], max_tokens="three")).encode()
    r = client.post(CHAT[0], content=raw, headers={"content-type": content_type})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "max_tokens"
    assert r.json()["error"]["type"] == "invalid_request_error"


def _chunks(raw: bytes) -> Iterator[bytes]:
    for start in range(0, len(raw), 7):  # many small chunks, no Content-Length
        yield raw[start : start + 7]


@ROUTES
def test_a_chunked_upload_is_read_whole(client: httpx.Client, path: str, base: dict) -> None:
    raw = json.dumps(_body(base, logit_bias=NO_EOS) if path != "/v1/messages" else _body(base))
    want = client.post(path, content=raw.encode(), headers=JSON)
    r = client.post(path, content=_chunks(raw.encode()), headers=JSON)
    assert "content-length" not in r.request.headers
    assert r.request.headers["transfer-encoding"] == "chunked"
    assert (want.status_code, r.status_code) == (200, 200), r.text
    assert _text(path, r.json()) == _text(path, want.json())


def test_an_empty_chunked_upload_is_still_a_missing_body(client: httpx.Client) -> None:
    r = client.post(CHAT[0], content=iter([b""]), headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "request body is required"


def test_a_utf8_bom_before_the_json_is_ignored(client: httpx.Client) -> None:
    raw = json.dumps(_body(CHAT[1])).encode()
    plain = client.post(CHAT[0], content=raw, headers={"content-type": "application/json"})
    bom = client.post(
        CHAT[0], content=b"\xef\xbb\xbf" + raw, headers={"content-type": "application/json"}
    )
    assert (plain.status_code, bom.status_code) == (200, 200), bom.text
    assert _text(CHAT[0], bom.json()) == _text(CHAT[0], plain.json())


def test_a_non_json_type_is_still_415(client: httpx.Client) -> None:
    raw = json.dumps(_body(CHAT[1])).encode()
    r = client.post(CHAT[0], content=raw, headers={"content-type": "Text/Plain"})
    assert r.status_code == 415


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/v1/responses/resp_x", "GET, HEAD, DELETE"),
        ("PATCH", "/v1/responses/resp_x", "GET, HEAD, DELETE"),
        ("POST", "/v1/responses/resp_x", "GET, HEAD, DELETE"),
        ("PUT", "/health", "GET, HEAD"),
        ("GET", "/v1/chat/completions", "POST"),
        ("DELETE", "/v1/models/some-model", "GET, HEAD"),
    ],
)
def test_a_405_allows_every_method_of_the_resource(
    client: httpx.Client, method: str, path: str, allow: str
) -> None:
    r = client.request(method, path)
    assert r.status_code == 405
    assert r.headers["allow"] == allow
    assert r.json()["error"]["message"] == "method not allowed"


def test_allowed_methods_follow_the_document() -> None:
    from mlxspec.http.paths import allowed_methods

    spec = {"paths": {"/a/{id}": {"get": {}, "delete": {}}, "/a/{id}/b": {"post": {}}}}
    allow = allowed_methods(spec)
    assert allow("/a/x") == "GET, HEAD, DELETE"
    assert allow("/a/x/b") == "POST"
    assert allow("/a/x/y") is None
    assert allow("/a/") is None


def test_an_empty_model_id_is_a_404(client: httpx.Client) -> None:
    r = client.get("/v1/models/")  # the document's 400 dumped jsonschema's report here
    assert r.status_code == 404
    assert r.json()["error"] == {
        "message": "not found: did you mean /v1/models? (no trailing slash)",
        "type": "not_found_error",
        "param": "model_id",
        "code": None,
    }


def test_a_parameter_error_keeps_only_the_first_line_of_jsonschemas_report() -> None:
    from mlxspec.errors import from_status

    detail = "'' should be non-empty\n\nFailed validating 'minLength' in schema:\n    {}"
    assert from_status(400, detail).message == "'' should be non-empty"

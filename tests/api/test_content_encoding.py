"""Request bodies with a ``Content-Encoding``: refused with 415 in each surface's
error shape and ``Accept-Encoding: identity`` (RFC 9110 section 15.5.16), never
parsed as if they were plain JSON. A body that is not JSON at all (a
``Content-Type`` other than ``application/json``) is a 415 too, naming it. The
``client`` fixture checks every response (status, headers, body) against the
document."""

from __future__ import annotations

import gzip
import json

import httpx
import pytest

from mlxspec.errors import ApiError
from mlxspec.openapi.validation import refuse_content_encoding

CHAT_BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
MESSAGES_BODY = {"max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
GZIP_MESSAGE = (
    "Content-Encoding 'gzip' is not supported: send the request body uncompressed (identity)"
)


def _post(client: httpx.Client, path: str, body: dict, encoding: str, squeeze: bool = True):
    raw = json.dumps(body).encode()
    headers = {"content-type": "application/json", "content-encoding": encoding}
    return client.post(path, content=gzip.compress(raw) if squeeze else raw, headers=headers)


def _openai_415(message: str) -> dict:
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "unsupported_media_type",
        }
    }


@pytest.mark.parametrize(
    "path,body",
    [
        ("/v1/chat/completions", CHAT_BODY),
        ("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
        ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
        ("/v1/embeddings", {"input": "hi"}),
    ],
)
def test_gzip_body_is_415_on_openai_routes(client: httpx.Client, path: str, body: dict) -> None:
    r = _post(client, path, body, "gzip")
    assert r.status_code == 415, r.text
    assert r.headers["accept-encoding"] == "identity"
    assert r.json() == _openai_415(GZIP_MESSAGE)


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_gzip_body_is_415_in_anthropic_shape(client: httpx.Client, path: str) -> None:
    r = _post(client, path, MESSAGES_BODY, "gzip")
    assert r.status_code == 415, r.text
    assert r.headers["accept-encoding"] == "identity"
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": GZIP_MESSAGE},
    }


def test_uncompressed_body_labelled_gzip_is_not_parsed(client: httpx.Client) -> None:
    # The header decides: a plain JSON body claiming gzip is refused, not read.
    r = _post(client, "/v1/chat/completions", CHAT_BODY, "gzip", squeeze=False)
    assert (r.status_code, r.json()) == (415, _openai_415(GZIP_MESSAGE))


@pytest.mark.parametrize(
    "encoding,named", [("br", "br"), ("deflate, gzip", "deflate"), ("identity, zstd", "zstd")]
)
def test_first_coding_other_than_identity_is_named(
    client: httpx.Client, encoding: str, named: str
) -> None:
    r = _post(client, "/v1/chat/completions", CHAT_BODY, encoding)
    message = GZIP_MESSAGE.replace("'gzip'", f"'{named}'")
    assert (r.status_code, r.json()) == (415, _openai_415(message))


@pytest.mark.parametrize("encoding", ["identity", "IDENTITY", ""])
def test_identity_body_is_read(client: httpx.Client, encoding: str) -> None:
    r = _post(client, "/v1/chat/completions", CHAT_BODY, encoding, squeeze=False)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"


def test_routes_without_a_body_ignore_the_header(client: httpx.Client) -> None:
    r = client.get("/v1/models", headers={"content-encoding": "gzip"})
    assert r.status_code == 200, r.text


def test_connection_is_usable_after_a_415(client: httpx.Client) -> None:
    assert _post(client, "/v1/chat/completions", CHAT_BODY, "gzip").status_code == 415
    r = client.post("/v1/chat/completions", json=CHAT_BODY)
    assert r.status_code == 200, r.text


def test_refuse_content_encoding_reads_every_header_line() -> None:
    refuse_content_encoding([(b"content-type", b"application/json")])
    refuse_content_encoding([(b"content-encoding", b" identity ")])
    with pytest.raises(ApiError) as err:
        refuse_content_encoding(
            [(b"content-encoding", b"identity"), (b"Content-Encoding", b"gzip")]
        )
    assert (err.value.status, err.value.message, err.value.headers) == (
        415,
        GZIP_MESSAGE,
        {"Accept-Encoding": "identity"},
    )


@pytest.mark.parametrize(
    "content_type,named",
    [
        ("text/plain", "text/plain"),
        ("application/x-www-form-urlencoded", "application/x-www-form-urlencoded"),
        ("multipart/form-data; boundary=x", "multipart/form-data"),
    ],
)
def test_a_body_that_is_not_json_is_415_naming_its_type(
    client: httpx.Client, content_type: str, named: str
) -> None:
    raw = json.dumps(CHAT_BODY).encode()
    message = f"Content-Type '{named}' is not supported: send application/json"
    r = client.post("/v1/chat/completions", content=raw, headers={"content-type": content_type})
    assert (r.status_code, r.json()) == (415, _openai_415(message))
    r = client.post("/v1/messages", content=raw, headers={"content-type": content_type})
    assert (r.status_code, r.json()) == (
        415,
        {"type": "error", "error": {"type": "invalid_request_error", "message": message}},
    )

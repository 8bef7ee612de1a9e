"""The response-contract checker (``mlxspec.conformance.contract``) and the
document's completeness.

Negative controls run the checker against a fake server (``httpx.MockTransport``)
that answers what a test tells it to; positive checks run it against the tiny
live server (the real one: ``tests/real/test_contract.py``), on responses
``tests/api/test_api.py`` does not make.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mlxspec.conformance.contract import ContractViolation, check_response, split_event_stream
from mlxspec.conformance.httpx_checks import checking_async_client, checking_client
from mlxspec.errors import ERROR_TABLE, anthropic_error_type
from mlxspec.openapi import load_spec

SPEC = load_spec()
JSON = {"content-type": "application/json"}
SSE = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}
COMP = "/v1/completions"
CHAT = "/v1/chat/completions"
USAGE = {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


def error(status: int, kind: str | None = None, message: str = "m") -> bytes:
    spec = (
        ERROR_TABLE[kind] if kind else next(r for r in ERROR_TABLE.values() if r.status == status)
    )
    body = {"message": message, "type": spec.type, "param": None, "code": spec.code}
    return json.dumps({"error": body}).encode()


def text_chunk(text: str = "a", finish: str | None = None, **extra: Any) -> dict:
    choice = {"index": 0, "text": text, "finish_reason": finish}
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    return {**head, "choices": [choice], **extra}


def stream(*frames: Any) -> bytes:
    out = b""
    for frame in frames:
        payload = frame if isinstance(frame, str) else json.dumps(frame)
        out += f"data: {payload}\n\n".encode()
    return out


GOOD_STREAM = stream(text_chunk("a"), text_chunk("", "length", usage=USAGE), "[DONE]")


def fake(status: int, body: bytes, headers: dict[str, str]) -> httpx.Client:
    """A checking client whose server answers every request with this response."""
    transport = httpx.MockTransport(
        lambda _req: httpx.Response(status, headers=headers, content=body)
    )
    return checking_client("http://fake", transport=transport)


def answer(status: int, body: bytes, headers: dict[str, str], method: str, path: str, **kw: Any):
    with fake(status, body, headers) as c:
        return c.request(method, path, **kw)


# --- negative controls: each rule catches its breach ---------------------------


def test_conforming_responses_pass() -> None:
    assert answer(200, b'{"status": "ok"}', JSON, "GET", "/health").status_code == 200
    r = answer(200, GOOD_STREAM, SSE, "POST", COMP, json={"prompt": "x", "stream": True})
    assert r.text.endswith("data: [DONE]\n\n")
    assert answer(200, b"", JSON, "HEAD", "/v1/models").status_code == 200
    assert answer(404, error(404), JSON, "GET", "/v1/models/other").status_code == 404


VIOLATIONS = [
    # id, status, body, headers, method, path, request kwargs, expected message
    ("body schema", 200, b'{"status": "fine"}', JSON, "GET", "/health", {}, "'ok' was expected"),
    ("required", 200, b'{"object": "list"}', JSON, "GET", "/v1/models", {}, "'data' is a required"),
    ("status", 201, b'{"status": "ok"}', JSON, "GET", "/health", {}, "http status: 201"),
    ("media type", 200, b"{}", {"content-type": "text/plain"}, "GET", "/health", {}, "text/plain"),
    ("empty body", 200, b"", JSON, "GET", "/health", {}, "Missing response data"),
    ("404 on list", 404, error(404), JSON, "GET", "/v1/models", {}, "http status: 404"),
    ("error shape", 400, b'{"detail": "x"}', JSON, "POST", COMP, {"json": {}}, "'error' is a"),
    ("error row", 400, error(404), JSON, "POST", COMP, {"json": {}}, "ERROR_TABLE"),
    ("unknown path 200", 200, b"{}", JSON, "GET", "/v2/x", {}, "must answer 404"),
    ("unknown path body", 404, b'{"detail": 1}', JSON, "GET", "/v2/x", {}, "'error' is a"),
    ("unknown path html", 404, b"no", {"content-type": "text/html"}, "GET", "/v2", {}, "json"),
    ("405 without Allow", 405, error(405), JSON, "GET", COMP, {}, "Allow None should list"),
    ("405 wrong Allow", 405, error(405), {**JSON, "allow": "GET"}, "PUT", "/health", {}, "head"),
    ("400 not 405", 400, error(400), JSON, "GET", COMP, {}, "expected 405"),
    ("redirect", 307, b"", {"location": "/v1"}, "GET", "/v1/", {}, "must answer 404"),
    ("SSE for JSON", 200, GOOD_STREAM, SSE, "POST", COMP, {"json": {}}, "stream=False must"),
    ("JSON for SSE", 200, b"{}", JSON, "POST", COMP, {"json": {"stream": True}}, "stream=True"),
    (
        "no Cache-Control",
        200,
        GOOD_STREAM,
        {"content-type": "text/event-stream"},
        "POST",
        COMP,
        {"json": {"stream": True}},
        "Cache-Control: no-cache",
    ),
    (
        "declared header",
        200,
        GOOD_STREAM,
        {**SSE, "cache-control": "max-age=3"},
        "POST",
        COMP,
        {"json": {"stream": True}},
        "'no-cache' was expected",
    ),
]


@pytest.mark.parametrize(
    ("status", "body", "headers", "method", "path", "kw", "expected"),
    [v[1:] for v in VIOLATIONS],
    ids=[v[0] for v in VIOLATIONS],
)
def test_violations_are_caught(
    status: int, body: bytes, headers: dict, method: str, path: str, kw: dict, expected: str
) -> None:
    with pytest.raises(ContractViolation) as err:
        answer(status, body, headers, method, path, **kw)
    assert expected in str(err.value), str(err.value)
    assert str(err.value).startswith(f"{method} {path} -> {status}")


STREAM_BREACHES = [
    (
        "no terminator",
        stream(text_chunk(), text_chunk("", "stop", usage=USAGE)),
        "without data: [DONE]",
    ),
    ("empty", b"", "does not end with a blank line"),
    ("only comments", b": keep-alive\n\n", "no data frames"),
    ("unterminated frame", GOOD_STREAM[:-1], "does not end with a blank line"),
    ("CRLF", GOOD_STREAM.replace(b"\n", b"\r\n"), "\\n only"),
    ("event field", b"event: x\n" + GOOD_STREAM, "not one 'data: ' line"),
    ("two data lines", b"data: 1\ndata: 2\n\n" + GOOD_STREAM, "not one 'data: ' line"),
    ("no space", GOOD_STREAM.replace(b"data: [DONE]", b"data:[DONE]"), "not one 'data: ' line"),
    ("chunk schema", stream({"id": "cmpl-1"}, "[DONE]"), "'choices' is a required property"),
    ("wrong object", stream(text_chunk(object="chat.completion.chunk"), "[DONE]"), "matches no"),
    ("not JSON", stream("{nope", "[DONE]"), "not JSON"),
    ("frame after DONE", GOOD_STREAM + stream(text_chunk()), "(done) must be the last"),
    ("DONE after error", stream(text_chunk(), json.loads(error(500)), "[DONE]"), "(error) must"),
    (
        "early finish",
        stream(text_chunk("", "stop"), text_chunk("", "stop", usage=USAGE), "[DONE]"),
        "last chunk only, got [0, 1]",
    ),
    (
        "usage chunk without usage",
        stream(text_chunk(), text_chunk("", "length"), text_chunk(choices=[]), "[DONE]"),
        "a last chunk without choices must carry usage",
    ),
    (
        "usage mid-stream",
        stream(text_chunk(usage=USAGE), text_chunk("", "length"), "[DONE]"),
        "only the last chunk before [DONE] may carry usage",
    ),
    (
        "two ids",
        stream(text_chunk(id="cmpl-2"), text_chunk("", "length", usage=USAGE), "[DONE]"),
        "share one id",
    ),
    (
        "error after finish",
        stream(text_chunk("", "stop"), json.loads(error(500))),
        "no finish_reason",
    ),
    (
        "error off the table",
        stream(text_chunk(), {"error": {"message": "m", "type": "oops"}}),
        "in-band error",
    ),
    ("bad UTF-8", b"data: \xff\n\n", "not UTF-8"),
]


@pytest.mark.parametrize(
    ("body", "expected"), [c[1:] for c in STREAM_BREACHES], ids=[c[0] for c in STREAM_BREACHES]
)
def test_stream_breaches_are_caught(body: bytes, expected: str) -> None:
    with pytest.raises(ContractViolation) as err:
        answer(200, body, SSE, "POST", COMP, json={"prompt": "x", "stream": True})
    assert expected in str(err.value), str(err.value)


def test_error_terminated_stream_and_keepalives_pass() -> None:
    body = b": keep-alive\n\n" + stream(text_chunk(), json.loads(error(500, "server_error")))
    answer(200, body, SSE, "POST", COMP, json={"prompt": "x", "stream": True})
    assert split_event_stream(b": a\n: b\n\ndata: x\n\n") == ["x"]


class _Pieces(httpx.SyncByteStream):
    """A body that arrives in pieces, as from a socket, and ends broken."""

    def __iter__(self) -> Iterator[bytes]:
        yield stream(text_chunk())
        yield b"data: {broken"


def test_partly_read_stream_is_not_checked_but_its_status_is() -> None:
    body = {"prompt": "x", "stream": True}
    whole = httpx.MockTransport(lambda _r: httpx.Response(200, headers=SSE, stream=_Pieces()))
    with checking_client("http://fake", transport=whole) as c:
        with pytest.raises(ContractViolation, match="does not end with a blank line"):
            c.post(COMP, json=body)
        with c.stream("POST", COMP, json=body) as r:
            assert next(r.iter_lines()).startswith("data: ")
    wrong = httpx.MockTransport(lambda _r: httpx.Response(201, headers=SSE, stream=_Pieces()))
    with checking_client("http://fake", transport=wrong) as c:
        with pytest.raises(ContractViolation, match="201"), c.stream("POST", COMP, json=body):
            pass


class _OneShot(httpx.SyncByteStream):
    """A conforming body that, like a socket, is empty when read a second time."""

    def __init__(self) -> None:
        self.left = [GOOD_STREAM[:10], GOOD_STREAM[10:]]

    def __iter__(self) -> Iterator[bytes]:
        while self.left:
            yield self.left.pop(0)


def test_a_second_drain_of_the_stream_is_not_checked() -> None:
    """The openai SDK iterates ``response.stream`` again after a stream ends."""
    transport = httpx.MockTransport(lambda _r: httpx.Response(200, headers=SSE, stream=_OneShot()))
    body = {"prompt": "x", "stream": True}
    with checking_client("http://fake", transport=transport) as c:
        with c.stream("POST", COMP, json=body) as r:
            assert r.read() == GOOD_STREAM
            assert list(r.stream) == []


def test_async_client_checks_too() -> None:
    async def go() -> None:
        transport = httpx.MockTransport(
            lambda _r: httpx.Response(200, headers=JSON, content=b'{"status": "no"}')
        )
        async with checking_async_client("http://fake", transport=transport) as c:
            with pytest.raises(ContractViolation, match="'ok' was expected"):
                await c.get("/health")

    asyncio.run(go())


def test_check_response_directly() -> None:
    check_response("get", "/v1/models/org/name?x=1", None, 404, JSON, error(404))
    check_response("GET", "/v1/models/org%2Fname", None, 200, JSON, None)  # body unread
    with pytest.raises(ContractViolation, match="GET /v1 -> 200: body"):
        check_response("GET", "/v1", None, 200, JSON, b'{"name": "x"}')


# --- the live tiny server: responses test_api.py does not make -------------------


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("HEAD", "/health", {}, 200),
        ("HEAD", "/v1/models/tiny-llama", {}, 200),
        ("OPTIONS", CHAT, {}, 405),
        ("PUT", "/health", {}, 405),
        ("DELETE", "/v1/models/tiny-llama", {}, 405),
        ("POST", "/openapi.json", {}, 405),
        ("GET", "/openapi.json", {}, 200),
        ("GET", "/v1/", {}, 404),  # no trailing-slash redirect
        ("GET", "/v1/models/", {}, 404),  # an empty id names no model
        ("GET", "/v1/models/a%2Fb", {}, 404),
        ("GET", "/v1/models?x=1", {}, 200),
        ("GET", "/health", {"content-type": "multipart/form-data"}, 200),
        ("GET", "/v1/models/tiny-llama", {"content-type": "multipart/form-data"}, 200),
        ("POST", COMP, {"content-type": "multipart/form-data; boundary=x"}, 415),
        ("POST", COMP, {"content-type": "application/json; charset=utf-8"}, 200),
    ],
)
def test_edge_requests_conform(client: httpx.Client, method, path, headers, status) -> None:
    body = b'{"prompt": "hi", "max_tokens": 1}' if method == "POST" else None
    assert client.request(method, path, headers=headers, content=body).status_code == status


def test_streams_with_logprobs_and_stop_conform(client: httpx.Client) -> None:
    for route, body in (
        (COMP, {"prompt": "hi"}),
        (CHAT, {"messages": [{"role": "user", "content": "hi"}]}),
    ):
        extra = {"max_tokens": 3, "stream": True, "logprobs": True, "stop": ["\u0000"]}
        r = client.post(route, json={**body, **extra})
        assert r.text.endswith("data: [DONE]\n\n")


# --- the document: completeness the checker relies on -------------------------------


def _walk(node: Any, where: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield where, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, (*where, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _walk(value, (*where, i))


def _deref(node: dict) -> dict:
    while "$ref" in node:
        target: Any = SPEC
        for part in node["$ref"][2:].split("/"):
            target = target[part]
        node = target
    return node


def _responses() -> Iterator[tuple[str, str, dict]]:
    for path, item in SPEC["paths"].items():
        for method, op in item.items():
            for status, response in op["responses"].items():
                yield f"{method.upper()} {path} {status}", status, _deref(response)


def test_every_error_example_is_a_row_of_the_error_table() -> None:
    """OpenAI-envelope examples are rows of the table; Anthropic-envelope ones
    (the /v1/messages routes) carry the type of their status and a row's status."""
    rows = {(r.status, r.type, r.code) for r in ERROR_TABLE.values()}
    checked = 0
    for name, status, response in _responses():
        media = response.get("content", {}).get("application/json")
        # /metrics is text; the flush route's 503 is its report, not an ErrorResponse
        if (
            media is None
            or status == "200"
            or media["schema"] != {"$ref": "#/components/schemas/ErrorResponse"}
        ):
            continue
        for example in media["examples"].values():
            err = example["value"]["error"]
            if example["value"].get("type") == "error":
                assert name.split()[1].startswith("/v1/messages"), name
                assert err["type"] == anthropic_error_type(int(status)), name
                assert int(status) in {r.status for r in ERROR_TABLE.values()}, name
            else:
                assert (int(status), err["type"], err["code"]) in rows, name
            checked += 1
    assert checked >= 10


def test_components_are_referenced_not_copied() -> None:
    """No inline schema repeats a component schema (Usage, ErrorResponse, ...)."""
    schemas = SPEC["components"]["schemas"]
    bodies = {json.dumps(s, sort_keys=True): name for name, s in schemas.items()}
    for where, node in _walk(SPEC):
        if isinstance(node, dict):
            copy = bodies.get(json.dumps(node, sort_keys=True))
            assert copy is None or where == ("components", "schemas", copy), (where, copy)
    error_schemas = [
        node
        for where, node in _walk(SPEC)
        if where[-1:] == ("schema",) and "ErrorResponse" in json.dumps(node)
    ]
    assert error_schemas
    envelopes = [
        {"$ref": f"#/components/schemas/{n}ErrorResponse"} for n in ("", "Anthropic", "Lab")
    ]
    assert all(node in envelopes for node in error_schemas)


def test_every_stream_documents_each_frame_kind() -> None:
    for path in (CHAT, COMP):
        media = SPEC["paths"][path]["post"]["responses"]["200"]["content"]["text/event-stream"]
        event = _deref(media["schema"])
        branches = event["properties"]["data"]["anyOf"]
        assert {"const": "[DONE]"} in branches
        refs = [b["contentSchema"]["$ref"].split("/")[-1] for b in branches if "contentSchema" in b]
        assert refs[-1] == "ErrorResponse" and len(refs) == 2
        kinds = set()
        for example in media["examples"].values():
            data = example["value"]["data"]
            kinds.add(
                "done" if data == "[DONE]" else "error" if "error" in json.loads(data) else "chunk"
            )
        assert kinds == {"done", "error", "chunk"}, path
        headers = SPEC["paths"][path]["post"]["responses"]["200"]["headers"]
        assert set(headers) == {"Cache-Control", "X-Accel-Buffering", "Warning"}


def test_generation_routes_declare_every_status_the_app_can_give() -> None:
    # 400 (schema, JSON, context window, context cap, framing), 401 (API key), 403
    # (Host), 408 (headers or body stalled), 413 (body size), 415 (Content-Type), 429
    # (queue), 431 (headers too large), 499 (client left), 500, 503 (connection cap),
    # 404 (model_not_found under --strict-model).
    for path in (CHAT, COMP):
        assert set(SPEC["paths"][path]["post"]["responses"]) == {
            "200",
            "400",
            "401",
            "403",
            "404",
            "408",
            "413",
            "415",
            "429",
            "431",
            "499",
            "500",
            "503",
        }
    # Every route answers 400 for a form Content-Type without a boundary (Connexion parses it),
    # and 401 with --api-key unless it opts out of security (only /health).
    for path, item in SPEC["paths"].items():
        for op in item.values():
            assert {"400", "403", "408", "431", "500", "503"} <= set(op["responses"]), path
            assert ("401" in op["responses"]) == (op.get("security") != []), path

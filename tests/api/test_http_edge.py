"""The HTTP edge (issue 16, faults 4 and 5): connections that stall or flood, oversized
headers and broken framing (:mod:`mlxspec.http.connections`), and requests a web page
could forge (:mod:`mlxspec.http.guard`, the 415 of a body without ``Content-Type``).

Live uvicorn servers on the tiny model with short limits set as the flags set them;
raw sockets where an HTTP client would not send what is tested. Responses read
through ``checking_client`` are checked against the document.
"""

from __future__ import annotations

import json
import resource
import selectors
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mlxspec.cli.flags import parse_config
from mlxspec.config import ServeConfig
from mlxspec.conformance.contract import UNDOCUMENTED_GET, ContractViolation, check_response
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.http.app import NO_TYPE, create_app
from mlxspec.http.connections import ConnectionLimits, EdgeProtocol, uvicorn_config
from mlxspec.http.guard import allowed_host_names, binds_loopback, host_name
from tests.conftest import LiveServer

CHAT = "/v1/chat/completions"
MESSAGES = "/v1/messages"
CHAT_BODY = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
EVIL = "https://evil.example"
#: The flags' values under test: short, so the suite stays quick.
EDGE_FLAGS = [
    "serve",
    *("--header-timeout", "2", "--keep-alive-timeout", "1", "--max-connections", "20"),
]


def openai_error(message: str, type_: str, code: str | None) -> dict:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def anthropic_error(message: str, type_: str = "invalid_request_error") -> dict:
    return {"type": "error", "error": {"type": type_, "message": message}}


@pytest.fixture(scope="module")
def edge(tiny_engine: Any) -> Iterator[LiveServer]:
    """A server with the short limits of :data:`EDGE_FLAGS`."""
    config = parse_config(EDGE_FLAGS)
    assert (config.header_timeout, config.keep_alive_timeout) == (2.0, 1.0)
    assert (config.max_connections, config.max_header_bytes) == (20, 64 * 1024)
    with LiveServer(create_app(tiny_engine, config, validate_responses=True), config) as server:
        yield server


@pytest.fixture()
def edge_client(edge: LiveServer) -> Iterator[httpx.Client]:
    with checking_client(edge.base, timeout=30) as c:
        yield c


def _connect(server: LiveServer, timeout: float = 10) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _read_to_close(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _parse(raw: bytes) -> tuple[int, dict[str, str], Any]:
    """Status, headers (lower-case names) and JSON body of one whole response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, json.loads(body)


def _idle_connections(server: LiveServer, timeout: float = 10) -> None:
    """Wait until the server holds no connection (earlier tests' have closed)."""
    deadline = time.monotonic() + timeout
    while server.server.server_state.connections and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not server.server.server_state.connections


# ------------------------------------------------------------ fault 4: connections


def test_headers_that_never_end_get_408_and_a_silent_socket_is_closed(edge: LiveServer) -> None:
    with _connect(edge) as slow, _connect(edge) as silent:
        slow.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: a")
        started = time.monotonic()
        raw = _read_to_close(slow)
        waited = time.monotonic() - started
        assert _read_to_close(silent) == b""  # opened at the same time: closed by now
    assert 1.8 <= waited < 8, waited
    status, headers, body = _parse(raw)
    assert (status, headers["connection"], headers["content-type"]) == (
        408,
        "close",
        "application/json",
    )
    message = "the request headers did not arrive within 2 s"
    assert body == openai_error(message, "invalid_request_error", "request_timeout")


@pytest.mark.parametrize("path", ["/health", MESSAGES])
def test_a_1_mb_header_is_431_in_the_paths_envelope(edge: LiveServer, path: str) -> None:
    with _connect(edge) as sock:
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ".encode())
        sock.sendall(b"a" * 2**20 + b"\r\n\r\n")
        status, headers, body = _parse(_read_to_close(sock))
    assert (status, headers["connection"]) == (431, "close")
    message = "request line and headers exceed 65536 bytes"
    if path == MESSAGES:
        assert body == anthropic_error(message)
    else:
        assert body == openai_error(message, "invalid_request_error", "request_headers_too_large")


def test_headers_under_the_limit_pass(edge_client: httpx.Client) -> None:
    r = edge_client.get("/health", headers={"x-big": "a" * 60_000})
    assert (r.status_code, r.json()) == (200, {"status": "ok"})


def test_a_kept_alive_connection_is_closed_after_the_idle_timeout(edge: LiveServer) -> None:
    with _connect(edge) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        raw = b""
        while not raw.endswith(b'{"status": "ok"}'):
            raw += sock.recv(65536)
        answered = time.monotonic()
        assert _read_to_close(sock) == b""
        idle = time.monotonic() - answered
    assert raw.startswith(b"HTTP/1.1 200 ")
    assert 0.8 <= idle < 6, idle


def test_sockets_over_the_cap_get_503_json_and_the_others_are_served(edge: LiveServer) -> None:
    _idle_connections(edge)
    admitted = [_connect(edge) for _ in range(20)]
    extra = [_connect(edge) for _ in range(5)]
    try:
        extra[0].sendall(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answers = [_parse(_read_to_close(sock)) for sock in extra]  # the idle ones: after 1 s
        admitted[0].sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        served = _read_to_close(admitted[0])
    finally:
        for sock in admitted + extra:
            sock.close()
    message = "the server has 20 open connections, its --max-connections; retry later"
    for status, headers, body in answers:
        assert (status, headers["retry-after"], headers["connection"]) == (503, "1", "close")
        assert body == openai_error(message, "server_error", "too_many_connections")
    assert served.startswith(b"HTTP/1.1 200 ") and served.endswith(b'{"status": "ok"}')


@pytest.mark.timeout(120)
def test_1100_sockets_against_the_default_cap_of_1000(tiny_engine: Any) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 2 * 1100 + 200  # both ends live in this process
    if soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"open-files hard limit {hard} < {wanted}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    config = ServeConfig(header_timeout=10)
    assert config.max_connections == 1000
    with LiveServer(create_app(tiny_engine, config), config) as server:
        _idle_connections(server)
        socks = [_connect(server) for _ in range(1100)]
        try:
            refused = _answered_within(socks, seconds=5, expected=100)
            still_open = len(server.server.server_state.connections)
        finally:
            for sock in socks:
                sock.close()
    assert len(refused) == 100
    assert {_parse(raw)[0] for raw in refused} == {503}
    assert still_open >= 1000


def _answered_within(socks: list[socket.socket], seconds: float, expected: int) -> list[bytes]:
    """What the sockets that the server answered (and closed) received, waiting
    until ``expected`` of them are done or ``seconds`` have passed."""
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ, b"")
    done: list[bytes] = []
    deadline = time.monotonic() + seconds
    while len(done) < expected and (left := deadline - time.monotonic()) > 0:
        for key, _ in selector.select(left):
            chunk = key.fileobj.recv(65536)
            if chunk:
                selector.modify(key.fileobj, selectors.EVENT_READ, key.data + chunk)
            else:
                done.append(key.data)
                selector.unregister(key.fileobj)
    selector.close()
    return done


@pytest.mark.parametrize(
    ("path", "framing", "reason"),
    [
        (CHAT, b"Content-Length: abc\r\n", "Invalid character in Content-Length"),
        (
            MESSAGES,
            b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
            "Transfer-Encoding can't be present with Content-Length",
        ),
    ],
    ids=["non-numeric", "length-and-chunked"],
)
def test_framing_errors_are_json_400s(
    edge: LiveServer, tiny_engine: Any, path: str, framing: bytes, reason: str
) -> None:
    submitted = tiny_engine.submitted
    with _connect(edge) as sock:
        head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        sock.sendall(head.encode() + framing + b"\r\n0\r\n\r\n")
        status, headers, body = _parse(_read_to_close(sock))
    assert (status, headers["content-type"]) == (400, "application/json")
    message = f"malformed HTTP request: {reason}"
    if path == MESSAGES:
        assert body == anthropic_error(message)
    else:
        assert body == openai_error(message, "invalid_request_error", "malformed_request")
    assert tiny_engine.submitted == submitted


# ------------------------------------------------------------ fault 5: forged requests


def test_a_cross_origin_simple_post_is_415_and_runs_nothing(
    edge_client: httpx.Client, tiny_engine: Any
) -> None:
    submitted = tiny_engine.submitted
    simple = {"content-type": "text/plain;charset=UTF-8", "origin": EVIL}
    r = edge_client.post(CHAT, content=CHAT_BODY, headers=simple)
    message = "Content-Type 'text/plain' is not supported: send application/json"
    assert (r.status_code, r.json()) == (
        415,
        openai_error(message, "invalid_request_error", "unsupported_media_type"),
    )
    assert tiny_engine.submitted == submitted


@pytest.mark.parametrize("path", [CHAT, MESSAGES, "/admin/cache/flush"])
def test_a_body_without_content_type_is_415(
    edge_client: httpx.Client, tiny_engine: Any, path: str
) -> None:
    submitted = tiny_engine.submitted
    r = edge_client.post(path, content=CHAT_BODY)
    assert "content-type" not in r.request.headers
    assert r.status_code == 415
    if path == MESSAGES:
        assert r.json() == anthropic_error(NO_TYPE)
    else:
        assert r.json() == openai_error(NO_TYPE, "invalid_request_error", "unsupported_media_type")
    assert tiny_engine.submitted == submitted


def test_post_routes_without_a_body_need_no_content_type(edge_client: httpx.Client) -> None:
    flush = edge_client.post("/admin/cache/flush")
    assert "content-type" not in flush.request.headers
    assert (flush.status_code, flush.json()["durable"]) == (200, True)
    cancel = edge_client.post("/v1/responses/resp_missing/cancel")
    assert (cancel.status_code, cancel.json()["error"]["code"]) == (404, "response_not_found")
    typed = edge_client.post(
        "/v1/responses/resp_missing/cancel", content=b"x", headers={"content-type": "text/plain"}
    )
    message = (
        "/v1/responses/resp_missing/cancel takes no request body: send none, "
        "or send application/json"
    )
    assert (typed.status_code, typed.json()["error"]["message"]) == (415, message)


@pytest.mark.parametrize("path", ["/health", CHAT, MESSAGES, "/v2/nothing", "/openapi.json"])
def test_a_foreign_host_is_403_on_a_loopback_server(
    edge_client: httpx.Client, tiny_engine: Any, path: str
) -> None:
    submitted = tiny_engine.submitted
    headers = {"host": "evil.example", "content-type": "application/json"}
    if path in (CHAT, MESSAGES):
        r = edge_client.post(path, content=CHAT_BODY, headers=headers)
    else:
        r = edge_client.get(path, headers=headers)
    message = (
        "Host 'evil.example' is not allowed: this server answers 127.0.0.1, [::1], localhost; "
        "add names with --allowed-hosts"
    )
    assert r.status_code == 403
    if path == MESSAGES:
        assert r.json() == anthropic_error(message, "permission_error")
    else:
        assert r.json() == openai_error(message, "permission_error", "host_not_allowed")
    assert tiny_engine.submitted == submitted


@pytest.mark.parametrize("host", ["localhost:8080", "127.0.0.1", "[::1]:1", "LOCALHOST."])
def test_the_loopback_names_pass_with_any_port(edge_client: httpx.Client, host: str) -> None:
    assert edge_client.get("/health", headers={"host": host}).status_code == 200


def test_admin_refuses_a_foreign_origin(edge_client: httpx.Client) -> None:
    for origin in (EVIL, "null", "http://localhost.evil.example"):
        r = edge_client.post("/admin/cache/flush", headers={"origin": origin})
        message = f"Origin {origin!r} may not call /admin routes: allow it with --allowed-origins"
        assert (r.status_code, r.json()) == (
            403,
            openai_error(message, "permission_error", "origin_not_allowed"),
        )
    local = edge_client.post("/admin/cache/flush", headers={"origin": "http://localhost:3000"})
    assert local.status_code == 200
    # the Origin check is /admin's: other routes leave cross-origin reads to CORS
    assert edge_client.get("/v1/models", headers={"origin": EVIL}).status_code == 200


@pytest.fixture(scope="module")
def named(tiny_engine: Any) -> Iterator[LiveServer]:
    """A loopback server that also answers ``llm.lan`` and lets ``ui.example`` in."""
    config = parse_config(
        [
            "serve",
            "--allowed-hosts",
            "llm.lan, Box.Local",
            "--allowed-origins",
            "https://ui.example",
        ]
    )
    assert config.allowed_hosts == ("llm.lan", "Box.Local")
    with LiveServer(create_app(tiny_engine, config, validate_responses=True), config) as server:
        yield server


def test_allowed_hosts_and_origins_from_flags(named: LiveServer) -> None:
    with checking_client(named.base, timeout=30) as c:
        assert c.get("/health", headers={"host": "llm.lan:8080"}).status_code == 200
        assert c.get("/health", headers={"host": "box.local"}).status_code == 200
        assert c.get("/health", headers={"host": "evil.example"}).status_code == 403
        ui = c.post("/admin/cache/flush", headers={"origin": "https://ui.example"})
        assert (ui.status_code, ui.headers["access-control-allow-origin"]) == (
            200,
            "https://ui.example",
        )
        # an allowed host's pages may call /admin too
        assert c.post("/admin/cache/flush", headers={"origin": "http://llm.lan"}).status_code == 200
        assert c.post("/admin/cache/flush", headers={"origin": EVIL}).status_code == 403


def test_which_binds_check_the_host() -> None:
    assert binds_loopback("127.0.0.1") and binds_loopback("127.0.0.2") and binds_loopback("::1")
    assert binds_loopback("localhost")
    assert not binds_loopback("0.0.0.0") and not binds_loopback("::")
    assert not binds_loopback("192.168.1.20")
    assert allowed_host_names(ServeConfig(host="0.0.0.0")) is None
    assert allowed_host_names(ServeConfig(host="0.0.0.0", allowed_hosts=("*",))) is None
    assert allowed_host_names(ServeConfig(host="127.0.0.1", allowed_hosts=("*",))) is None
    assert allowed_host_names(ServeConfig(host="0.0.0.0", allowed_hosts=("llm.lan",))) == {
        "localhost",
        "127.0.0.1",
        "[::1]",
        "0.0.0.0",
        "llm.lan",
    }
    assert allowed_host_names(ServeConfig(host="::1")) == {"localhost", "127.0.0.1", "[::1]"}
    assert [host_name(h) for h in ("LocalHost:80", "[::1]:8080", "::1", "a.example.")] == [
        "localhost",
        "[::1]",
        "[::1]",
        "a.example",
    ]


def test_a_request_without_host_passes(edge: LiveServer) -> None:
    with _connect(edge) as sock:
        sock.sendall(b"GET /health HTTP/1.0\r\n\r\n")
        status, _, body = _parse(_read_to_close(sock))
    assert (status, body) == (200, {"status": "ok"})


def test_a_bind_beyond_loopback_does_not_check_the_host(tiny_engine: Any) -> None:
    config = ServeConfig(host="0.0.0.0")
    with LiveServer(create_app(tiny_engine, config), config) as server:
        r = httpx.get(f"{server.base}/health", headers={"host": "box.lan:8080"})
    assert r.status_code == 200


# ------------------------------------------------------------ the document routes


def test_openapi_yaml_is_public_like_openapi_json(tiny_engine: Any) -> None:
    config = ServeConfig(api_key="sk-edge")
    with LiveServer(create_app(tiny_engine, config), config) as server:
        with checking_client(server.base, timeout=30) as c:
            document = c.get("/openapi.json").json()
            first, again = c.get("/openapi.yaml"), c.get("/openapi.yaml")
            refused = c.get("/v1/models")
    assert first.headers["content-type"] == "text/yaml; charset=utf-8"
    assert UNDOCUMENTED_GET["/openapi.yaml"](first.text) == document and again.text == first.text
    assert document["security"] == [{"bearerAuth": []}, {"apiKeyAuth": []}]  # the keyed copy
    assert refused.status_code == 401


# ------------------------------------------------------------ the contract checker


def test_the_contract_checker_knows_the_edge_answers() -> None:
    forbidden = json.dumps(openai_error("m", "permission_error", "host_not_allowed")).encode()
    json_type = {"content-type": "application/json"}
    for method, path in (("GET", "/v2/x"), ("GET", "/openapi.yaml"), ("PUT", "/health")):
        check_response(method, path, None, 403, json_type, forbidden)
    full = json.dumps(openai_error("m", "server_error", "too_many_connections")).encode()
    check_response("POST", "/admin/cache/flush", None, 503, json_type, full)
    check_response("GET", "/v2/x", None, 503, json_type, full)
    not_edge = json.dumps(openai_error("m", "permission_error", None)).encode()
    with pytest.raises(ContractViolation, match="must answer 404"):
        check_response("GET", "/v2/x", None, 403, json_type, not_edge)
    with pytest.raises(ContractViolation, match="with the document"):
        check_response("GET", "/openapi.yaml", None, 200, {"content-type": "text/yaml"}, b"[1")


# ------------------------------------------------------------ flags


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--header-timeout", "0"),
        ("--header-timeout", "nan"),
        ("--keep-alive-timeout", "-1"),
        ("--max-connections", "-1"),
        ("--max-header-bytes", "0"),
    ],
)
def test_bad_limit_flags_exit_2(flag: str, value: str, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_config(["serve", flag, value])
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err


def test_the_limits_reach_uvicorn() -> None:
    config = parse_config(["serve", "--max-connections", "0", "--max-header-bytes", "16K"])
    built = uvicorn_config(object(), config)
    assert built.timeout_keep_alive == 30.0 and built.limit_concurrency is None
    assert built.http.limits == ConnectionLimits(30.0, 16 * 1024, None)  # 0: no cap
    assert issubclass(built.http, EdgeProtocol)

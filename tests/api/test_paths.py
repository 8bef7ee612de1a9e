"""The document's paths as the router answers them (``mlxspec.http.paths``): a 404 for
a mistyped base URL names the route the client meant, in that route's error
envelope; concrete paths shadowed by a template are known; paths match exactly
(no trailing-slash redirect), and a keyed server checks the key before a 404."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from mlxspec.config import ServeConfig
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.http.app import create_app
from mlxspec.http.paths import shadowed_methods, suggest_path
from mlxspec.openapi import served_spec
from tests.conftest import LiveServer

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
        # a trailing slash is not redirected: the hint names the exact path
        ("GET", "/stats/", "/stats"),
        ("GET", "/v1/", "/v1"),
        ("POST", "/v1/chat/completions//", "/v1/chat/completions"),
        ("GET", "/v1/chat/completions/", None),
        ("GET", "/", None),
    ],
)
def test_suggest_path(method: str, path: str, guess: str | None) -> None:
    assert suggest_path(SPEC)(path, method) == guess


def test_shadowed_paths() -> None:
    # DELETE /v1/adapters/available is a 405, not an unmount: "available" is no adapter id
    assert shadowed_methods(SPEC) == {
        "/v1/responses/input_tokens": {"POST"},
        "/v1/adapters/available": {"GET", "HEAD"},
    }


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
    r = client.post("/embeddings", json={})
    assert r.status_code == 404
    assert r.json() == {
        "error": {
            "message": "not found: did you mean /v1/embeddings? (check the client's base URL)",
            "type": "not_found_error",
            "param": None,
            "code": None,
        }
    }
    plain = client.get("/v1/nothing")
    assert (plain.status_code, plain.json()["error"]["message"]) == (404, "not found")


@pytest.mark.parametrize(
    ("method", "alias", "body"),
    [
        ("POST", "/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/completions", {"prompt": "hi"}),
        ("GET", "/models", None),
    ],
)
def test_mlx_lm_server_paths_without_v1_answer_the_same(
    client: httpx.Client, method: str, alias: str, body: dict | None
) -> None:
    """mlx_lm.server answers ``/chat/completions``; the document's aliases
    (``x-mlxspec-path-aliases``) answer as the ``/v1`` operation, checked
    against its contract by ``client``."""
    if body is not None:
        body = {**body, "max_tokens": 3, "temperature": 0}
    short = client.request(method, alias, json=body)
    full = client.request(method, "/v1" + alias, json=body)
    assert short.status_code == full.status_code == 200
    key = "data" if alias == "/models" else "choices"  # ids, times and cache hits differ
    assert short.json()[key] == full.json()[key]
    bad = client.post("/chat/completions", json={"messages": []})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"


KEY = "sk-paths-0123"
#: Every GET the document declares without a template, with a trailing slash.
SLASHED_GETS = [
    p + "/" for p, item in SPEC["paths"].items() if "get" in item and "{" not in p and p != "/"
]
#: What the unslashed GETs answer: 200, but a redirect for the legacy page paths and
#: 426 for the WebSocket route, 400 for the search and export routes without their parameter.
UNSLASHED = {
    "/chat": 302,
    "/status": 302,
    "/ws/chat": 426,
    "/api/sessions/search": 400,  # q is required
    "/api/hub/search": 400,  # q is required
    "/api/sessions/export": 400,  # path is required
}


@pytest.fixture(scope="module")
def keyed_server(tiny_engine: Any) -> Iterator[LiveServer]:
    with LiveServer(create_app(tiny_engine, ServeConfig(api_key=KEY))) as server:
        yield server


def test_a_trailing_slash_is_a_404_naming_the_path_not_a_redirect(client: httpx.Client) -> None:
    r = client.get("/stats/")
    assert (r.status_code, r.headers.get("location")) == (404, None)
    assert r.json()["error"] == {
        "message": "not found: did you mean /stats? (no trailing slash)",
        "type": "not_found_error",
        "param": None,
        "code": None,
    }
    post = client.post("/v1/chat/completions/", json={"messages": []})
    assert post.status_code == 404
    assert post.json()["error"]["message"] == (
        "not found: did you mean /v1/chat/completions? (no trailing slash)"
    )
    served = client.get("/v1/models").json()["data"][0]["id"]
    for path, meant in [
        ("/v1/models/", "/v1/models"),
        (f"/v1/models/{served}/", f"/v1/models/{served}"),
    ]:
        r = client.get(path)  # the route /v1/models/{model_id} takes these
        assert r.status_code == 404, path
        assert (
            r.json()["error"]["message"] == f"not found: did you mean {meant}? (no trailing slash)"
        )
        assert client.get(meant).status_code == 200
        # another method there is no 405 advertising that GET: the path is not one
        post = client.post(path, json={})
        assert (post.status_code, post.headers.get("allow")) == (404, None), path
        assert post.json()["error"]["message"] == "not found"
    assert "/stats/" in SLASHED_GETS and "/health/" in SLASHED_GETS
    for path in SLASHED_GETS:
        assert client.get(path).status_code == 404, path
        assert client.get(path.rstrip("/")).status_code == UNSLASHED.get(path[:-1], 200), path


def test_a_keyed_server_checks_the_key_before_any_route_miss(keyed_server: LiveServer) -> None:
    with checking_client(keyed_server.base, timeout=30) as c:
        for path in ["/nothing", "/openapi.json/", *SLASHED_GETS]:
            r = c.get(path)
            assert (r.status_code, r.headers.get("location")) == (401, None), path
            assert r.headers["www-authenticate"] == "Bearer"
            assert r.json()["error"]["message"] == "No authorization token provided"
        wrong = c.get("/stats/", headers={"x-api-key": "nope"})
        assert (wrong.status_code, wrong.json()["error"]["message"]) == (401, "invalid API key")
        messages = c.post("/v1/messages/", json={})
        assert (messages.status_code, messages.json()["error"]) == (
            401,
            {"type": "authentication_error", "message": "No authorization token provided"},
        )
        # a method the route does not take: 401 without the key, 405 with it
        for method, path in [("GET", "/v1/chat/completions"), ("POST", "/v1/models")]:
            r = c.request(method, path)
            assert (r.status_code, r.headers.get("allow")) == (401, None), path
            r = c.request(method, path, headers={"x-api-key": KEY})
            assert r.status_code == 405 and r.headers["allow"], path
        # with the key (either header), a route miss is the plain 404 again
        for auth in ({"Authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}):
            missed = c.get("/stats/", headers=auth)
            assert missed.status_code == 404
            assert missed.json()["error"]["message"].endswith("(no trailing slash)")
        # the documented routes are unchanged
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/openapi.json").status_code == 200
        assert c.get("/stats").status_code == 401
        assert c.get("/stats", headers={"x-api-key": KEY}).status_code == 200


def test_sdk_base_urls_with_a_trailing_slash_work(keyed_server: LiveServer) -> None:
    """Both SDKs join their paths onto a base URL ending in ``/`` without doubling
    it, so such a base URL reaches the exact routes."""
    base = keyed_server.base
    oa = openai.OpenAI(
        base_url=f"{base}/v1/", api_key=KEY, max_retries=0, http_client=checking_client()
    )
    with oa:
        served = [m.id for m in oa.models.list().data if getattr(m, "tier", None) is None]
        assert served == ["tiny-llama"]  # the library's models on disk follow, with a tier
        chat = oa.chat.completions.create(
            model="tiny-llama", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        assert chat.usage is not None and chat.usage.completion_tokens <= 2
    an = anthropic.Anthropic(
        base_url=f"{base}/",
        api_key=KEY,
        max_retries=0,
        http_client=checking_client(http=httpx2),
    )
    with an:
        message = an.messages.create(
            model="tiny-llama", max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
        assert message.type == "message" and message.usage.output_tokens <= 2

"""Chat templates that requests bring (``chat_template_kwargs.chat_template``).

Issue 16, fault 3: a request's template with nested ``range(100000)`` loops
rendered for hours before admission, and kept rendering after its client
left. Now a server takes one only with ``--allow-request-templates``; then it
renders within a step and time bound, holds a place in the admission queue
while it runs, and stops when the client leaves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from mlxspec.config import ServeConfig
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine import AdmissionLimits, Engine
from mlxspec.engine.prompt import dedupe_bos
from mlxspec.http.app import create_app
from tests.conftest import LiveServer

CHAT = "/v1/chat/completions"
USER = {"role": "user", "content": "hello"}
#: 10**10 loop iterations: unbounded, this renders for hours.
BOMB = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"
PARAM = "chat_template_kwargs.chat_template"
REFUSED = (
    "chat_template_kwargs.chat_template is not accepted: this server renders its model's own "
    "chat template, and takes templates from requests only when the operator starts it with "
    "--allow-request-templates"
)
#: A small template whose effect on the prompt shows: roles in capitals, a
#: variable of the request's, the model's BOS token.
SMALL = (
    "{{ bos_token }}{% for m in messages %}{{ m.role | upper }}: {{ m.content }} ({{ mood }})\n"
    "{% endfor %}{% if add_generation_prompt %}BOT:{% endif %}"
)


def chat_body(template: str, **extra: object) -> dict:
    kwargs = {"chat_template": template, "mood": "calm, very calm"}
    return {"messages": [USER], "max_tokens": 1, "chat_template_kwargs": kwargs, **extra}


def responses_body(template: str) -> dict:
    kwargs = {"chat_template": template, "mood": "calm, very calm"}
    return {"model": "m", "input": "hello", "max_output_tokens": 1, "chat_template_kwargs": kwargs}


def openai_error(r: httpx.Response, message: str, param: str | None = PARAM) -> None:
    assert r.status_code == 400, r.text
    error = {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    assert r.json() == {"error": error}


def bound_message(bound: str) -> str:
    return f"the request's chat template ({PARAM}) ran past this server's bound of {bound}"


def until(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.02)


@pytest.fixture(scope="module")
def bounded(tiny_engine: Engine) -> Iterator[LiveServer]:
    """A live server on the tiny engine with ``--allow-request-templates``,
    ``--request-template-steps 5000`` and ``--request-template-seconds 1``."""
    config = ServeConfig(
        allow_request_templates=True, request_template_steps=5000, request_template_seconds=1.0
    )
    with LiveServer(create_app(tiny_engine, config, validate_responses=True)) as server:
        yield server


# ------------------------------------------------------------- without the flag


@pytest.mark.parametrize(
    ("path", "body"),
    [
        (CHAT, chat_body(BOMB)),
        (CHAT, chat_body(BOMB, stream=True)),
        ("/v1/responses", responses_body(BOMB)),
        ("/v1/responses/input_tokens", responses_body(BOMB)),
    ],
)
def test_without_the_flag_a_template_is_refused_unrendered(
    client: httpx.Client, tiny_engine: Engine, path: str, body: dict
) -> None:
    # The answer arrives at all: rendering the bomb would take hours.
    openai_error(client.post(path, json=body), REFUSED)
    assert tiny_engine.in_flight == 0


def test_the_served_document_says_whether_templates_are_taken(
    client: httpx.Client, tclient: httpx.Client
) -> None:
    def field(c: httpx.Client) -> dict:
        schemas = c.get("/openapi.json").json()["components"]["schemas"]
        chat = schemas["CreateChatCompletionRequest"]["allOf"][1]["properties"]
        return chat["chat_template_kwargs"]["properties"]["chat_template"]

    assert field(client)["type"] == "null"
    assert field(tclient)["type"] == ["string", "null"]


def test_messages_take_no_template(client: httpx.Client) -> None:
    # Anthropic's Messages API has no such field: like any unknown field it is
    # ignored, and the model's own template renders.
    body = {"model": "m", "max_tokens": 1, "messages": [USER]}
    r = client.post("/v1/messages", json={**body, "chat_template_kwargs": {"chat_template": BOMB}})
    assert r.status_code == 200, r.text
    plain = client.post("/v1/messages", json=body).json()

    def prompt_tokens(usage: dict) -> int:  # the uncached part, plus the prompt cache's
        return usage["input_tokens"] + usage.get("cache_read_input_tokens", 0)

    assert prompt_tokens(r.json()["usage"]) == prompt_tokens(plain["usage"])


# ------------------------------------------------------------- with the flag


def test_a_small_template_is_used(tclient: httpx.Client, tiny_engine: Engine) -> None:
    tokenizer = tiny_engine.tokenizer
    text = f"{tokenizer.bos_token or ''}USER: hello (calm, very calm)\nBOT:"
    expected = len(dedupe_bos(tokenizer.encode(text, add_special_tokens=False), None))
    r = tclient.post(CHAT, json=chat_body(SMALL))
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == expected
    default = tclient.post(CHAT, json={"messages": [USER], "max_tokens": 1}).json()
    assert default["usage"]["prompt_tokens"] != expected  # the model's ChatML differs
    counted = tclient.post("/v1/responses/input_tokens", json=responses_body(SMALL))
    assert counted.json()["input_tokens"] == expected


#: Few steps, each building a 4-million-item list: seconds of work in 2,000 steps.
SLOW = "{% for i in range(500) %}{% set x = (range(100000) | list) * 40 %}{% endfor %}x"


def test_a_template_over_a_bound_is_400(bounded: LiveServer) -> None:
    steps = bound_message("5000 steps (--request-template-steps)")
    with checking_client(bounded.base, timeout=60) as c:
        openai_error(c.post(CHAT, json=chat_body(BOMB)), steps)
        openai_error(c.post(CHAT, json=chat_body(BOMB, stream=True)), steps)
        openai_error(c.post("/v1/responses", json=responses_body(BOMB)), steps)
        seconds = bound_message("1 seconds (--request-template-seconds)")
        openai_error(c.post(CHAT, json=chat_body(SLOW)), seconds)
        size = c.post(CHAT, json=chat_body("{{ 'x' * 1000000000 }}"))
        openai_error(
            size,
            f"the request's chat template ({PARAM}) would build a value over this server's "
            f"bound of {4 * 2**20} characters or items",
        )
        assert c.post(CHAT, json=chat_body(SMALL)).status_code == 200  # still serving
        assert c.get("/stats").json()["admission"]["in_flight"] == 0


def _leave_mid_render(base: str, body: dict, seconds: float) -> None:
    """Send ``body`` and hang up after ``seconds`` without an answer."""
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base}{CHAT}", json=body, timeout=httpx.Timeout(10, read=seconds))


def test_a_render_holds_a_place_and_stops_when_its_client_leaves(tiny_model_dir: Path) -> None:
    # One decode slot, no queue: the render's place is the only one.
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=1, limits=AdmissionLimits(0))
    engine.start()
    # Bounds that let the bomb render for two minutes.
    config = ServeConfig(
        allow_request_templates=True, request_template_steps=10**12, request_template_seconds=120
    )
    try:
        with LiveServer(create_app(engine, config, validate_responses=True)) as server:
            leaver = threading.Thread(
                target=_leave_mid_render, args=(server.base, chat_body(BOMB), 5)
            )
            with checking_client(server.base, timeout=60) as c:

                def in_flight() -> int:
                    return c.get("/stats").json()["admission"]["in_flight"]

                leaver.start()
                until(lambda: in_flight() == 1)
                plain = c.post(CHAT, json={"messages": [USER], "max_tokens": 1})
                templated = c.post(CHAT, json=chat_body(SMALL))
                leaver.join(30)
                # The render stopped: its place is free long before its two minutes are up.
                until(lambda: in_flight() == 0)
                after = c.post(CHAT, json=chat_body(SMALL))
    finally:
        engine.close()
    assert (plain.status_code, templated.status_code) == (429, 429)
    assert plain.json()["error"]["message"] == (
        "generation queue is full (0 requests waiting); retry later"
    )
    assert templated.json()["error"]["message"] == (
        "queue is full (0 requests waiting); this chat template request was not queued, retry later"
    )
    assert after.status_code == 200


# ------------------------------------------------------------- the flags


def test_the_flags_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from mlxspec.cli.flags import parse_config

    monkeypatch.delenv("MLXSPEC_ALLOW_REQUEST_TEMPLATES", raising=False)
    default = parse_config(["serve"])
    assert (default.allow_request_templates, default.request_template_steps) == (False, 100_000)
    assert default.request_template_seconds == 2.0
    flags = ["--allow-request-templates", "--request-template-steps", "50"]
    config = parse_config(["serve", *flags, "--request-template-seconds", "0.5"])
    assert (config.allow_request_templates, config.request_template_steps) == (True, 50)
    assert config.request_template_seconds == 0.5
    monkeypatch.setenv("MLXSPEC_ALLOW_REQUEST_TEMPLATES", "1")
    assert parse_config(["serve"]).allow_request_templates is True
    monkeypatch.setenv("MLXSPEC_ALLOW_REQUEST_TEMPLATES", "maybe")
    with pytest.raises(SystemExit):
        parse_config(["serve"])
    for bad in (["--request-template-steps", "0"], ["--request-template-seconds", "-1"]):
        monkeypatch.setenv("MLXSPEC_ALLOW_REQUEST_TEMPLATES", "0")
        with pytest.raises(SystemExit):
            parse_config(["serve", *bad])

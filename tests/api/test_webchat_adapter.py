"""``set_adapter`` on ``/ws/chat``: the session's LoRA adapter reaches the engine
request, an unknown id is an ``error`` frame naming it, the choice is stored.

The engine is this module's own tiny random model (adapters mounted here stay
here), with a random adapter ``a`` mounted over ``POST /v1/adapters``. Every
server frame is checked against the document (``ChatSocketServerFrame``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fixtures.random_adapters import make_random_adapter
from mlxspec.config import ServeConfig
from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.webchat_client import ChatClient

PROMPT = "hello there"
TOKENS = 8


@pytest.fixture(scope="module")
def engine(tiny_model_dir: Path) -> Iterator[Any]:
    from mlxspec.engine import Engine

    engine = Engine.load(tiny_model_dir, "tiny-llama")
    engine.start()
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def server(
    engine: Any, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("adapters")
    make_random_adapter(tiny_model_dir, root / "a", seed=1, num_layers=2, std=0.2)
    db = tmp_path_factory.mktemp("chat") / "chat.sqlite3"
    app = create_app(engine, ServeConfig(chat_db=str(db)), validate_responses=True)
    with LiveServer(app) as live:
        with checking_client(live.base) as http:
            r = http.post("/v1/adapters", json={"id": "a", "path": str(root / "a")})
            assert r.status_code == 200, r.text
        yield live


def http_answer(base: str, **extra: Any) -> str:
    """The same turn over ``POST /v1/chat/completions`` (greedy, as the chat's default)."""
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS, **extra}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def socket_turn(chat: ChatClient, frame: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A turn's ``turn_start`` and its text."""
    turn = chat.turn(frame)
    start = next(f for f in turn["frames"] if f["type"] == "turn_start")
    return start, turn["text"]


def test_set_adapter_reaches_the_engine_request(server: LiveServer) -> None:
    base, with_a = http_answer(server.base), http_answer(server.base, adapter="a")
    assert base != with_a  # the adapter changes the greedy answer
    with ChatClient(server.base) as chat:
        assert chat.greeting["ready"]["defaultAdapter"] is None  # no --adapter-path
        assert chat.greeting["history"]["settings"]["adapter"] is None
        chat.send({"type": "set_sampling", "max_tokens": TOKENS})
        chat.send({"type": "set_adapter", "adapter": "a"})
        start, text = socket_turn(chat, {"type": "prompt", "text": PROMPT})
        assert start["adapter"] == "a" and text == with_a
        sid = start["sessionId"]
        chat.send({"type": "set_adapter", "id": "none"})  # the reference's field
        start, text = socket_turn(chat, {"type": "regenerate"})
        assert start["adapter"] is None and text == base
        chat.send({"type": "set_adapter", "adapter": "a"})
    with ChatClient(server.base) as other:  # stored with the session's settings
        other.send({"type": "open_session", "id": sid})
        history = other.until("history")[-1]
        assert history["settings"]["adapter"] == "a"
        assert history["items"][-1]["content"] == base  # the regenerated answer
        other.send({"type": "set_adapter", "id": None})  # the server's default: none
        start, text = socket_turn(other, {"type": "regenerate"})
        assert start["adapter"] is None and text == base


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("nope", "unknown adapter 'nope': not mounted"),
        ("a+nope", "unknown adapter 'nope': not mounted"),
        ("a+a", "adapter 'a' is named twice in 'a+a'"),
    ],
)
def test_an_unknown_adapter_is_an_error_frame_and_nothing_changes(
    server: LiveServer, spec: str, message: str
) -> None:
    with ChatClient(server.base) as chat:
        chat.send({"type": "set_adapter", "adapter": "a"})
        chat.send({"type": "set_adapter", "adapter": spec})
        error = chat.until("error")[-1]
        assert error["message"] == message
        assert error["param"] == "adapter" and error["code"] is None  # as the HTTP 400 says
        chat.send({"type": "set_sampling", "max_tokens": 2})
        start, _ = socket_turn(chat, {"type": "prompt", "text": PROMPT})  # the socket stays open
        assert start["adapter"] == "a"  # the refused spec left the session's adapter


def test_a_malformed_set_adapter_is_refused_by_the_document(server: LiveServer) -> None:
    with ChatClient(server.base) as chat:
        chat.send({"type": "set_adapter", "adapter": 3})
        assert "Invalid type for 'adapter'" in chat.until("error")[-1]["message"]
        chat.send({"type": "set_adapter"})
        assert (
            chat.until("error")[-1]["message"]
            == "set_adapter.id is required (null: the server's default)"
        )

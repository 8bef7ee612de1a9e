"""transformers' "Token indices sequence length is longer than the specified
maximum sequence length ... indexing errors" line stays quiet: admission
answers an over-long prompt with a 400, so nothing is ever indexed past the
window. Other tokenizer warnings still come through.

transformers logs through its own library logger, which propagates only when
the environment says ``CI=true``; the tests attach pytest's ``caplog`` handler
to it and stop propagation meanwhile, so each record is captured once either
way. Every tokenizer and engine here is fresh: the line is warn-once per
tokenizer, and the shared ``tiny_engine`` may have been used for over-long
prompts by other modules.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from mlxspec.conformance.httpx_checks import checking_client
from mlxspec.engine.prompt import quiet_length_warning

LINE = "Token indices sequence length is longer than the specified maximum sequence length"
LONG = "hello there " * 200  # ~400 tokens, the tiny model's window is 256


@pytest.fixture()
def transformers_log(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """``caplog`` receiving the records of transformers' library logger."""
    logger = logging.getLogger("transformers")
    propagate = logger.propagate
    logger.propagate = False
    logger.addHandler(caplog.handler)
    try:
        yield caplog
    finally:
        logger.removeHandler(caplog.handler)
        logger.propagate = propagate


def _fresh_tokenizer(model_dir: Path):
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(model_dir)


def _lines(log: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in log.records if r.name.startswith("transformers")]


def test_unquieted_tokenizer_does_warn(tiny_model_dir: Path, transformers_log) -> None:
    # The control: without the fix this transformers still logs the line.
    tokens = _fresh_tokenizer(tiny_model_dir).encode(LONG)
    assert len(tokens) > 256
    assert [m for m in _lines(transformers_log) if m.startswith(LINE)] == [
        f"{LINE} for this model ({len(tokens)} > 256). Running this sequence through "
        "the model will result in indexing errors"
    ]


def test_quieted_tokenizer_keeps_other_warnings(tiny_model_dir: Path, transformers_log) -> None:
    tokenizer = _fresh_tokenizer(tiny_model_dir)
    quiet_length_warning(tokenizer)
    assert len(tokenizer.encode(LONG)) > 256
    assert _lines(transformers_log) == []
    # only that line's warn-once flag is spent; the tokenizer's other flags are not
    assert tokenizer.deprecation_warnings == {
        "sequence-length-is-longer-than-the-specified-maximum": True
    }
    # no filter or level hides the tokenization logger's other warnings
    logging.getLogger("transformers.tokenization_utils_base").warning("another warning")
    assert _lines(transformers_log) == ["another warning"]


def test_quiet_length_warning_ignores_foreign_tokenizers() -> None:
    class Bare:
        deprecation_warnings = None

    quiet_length_warning(Bare())  # no transformers flags: nothing to do, no error
    quiet_length_warning(object())


@pytest.fixture()
def fresh_server(tiny_model_dir: Path) -> Iterator[httpx.Client]:
    """A live server on a new engine (its own tokenizer), checking responses."""
    from mlxspec.engine import Engine
    from mlxspec.http.app import create_app
    from tests.conftest import LiveServer

    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=1, warmup=False)
    engine.start()
    try:
        with LiveServer(create_app(engine, validate_responses=True)) as server:
            with checking_client(server.base, timeout=60) as client:
                yield client
    finally:
        engine.close()


def test_over_long_prompts_are_400_without_the_line(fresh_server, transformers_log) -> None:
    comp = fresh_server.post("/v1/completions", json={"prompt": LONG, "max_tokens": 1})
    chat = fresh_server.post(
        "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": LONG}], "max_tokens": 1},
    )
    for r, param in ((comp, "prompt"), (chat, "messages")):
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert (err["type"], err["code"], err["param"]) == (
            "invalid_request_error",
            "context_length_exceeded",
            param,
        )
    assert [m for m in _lines(transformers_log) if LINE in m] == []

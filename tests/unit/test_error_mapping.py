"""``errors.from_exception`` / ``from_status`` / ``from_failure``: what any
raised exception or unfinished engine request becomes on the wire (pure)."""

from __future__ import annotations

import logging

import pytest
from connexion.exceptions import ProblemException
from starlette.exceptions import HTTPException

from mlxspec.engine import (
    Cancelled,
    ContextBudgetError,
    ContextLengthError,
    EngineRequestError,
    Failed,
    PromptError,
    QueueFullError,
)
from mlxspec.errors import (
    INTERNAL_MESSAGE,
    ApiError,
    error_status,
    from_exception,
    from_failure,
    from_status,
    openai_error_body,
)


def test_an_api_error_is_itself() -> None:
    err = ApiError("response_not_found", "response 'resp_x' not found", param="response_id")
    assert from_exception(err) is err


@pytest.mark.parametrize(
    ("exc", "kind", "status", "code"),
    [
        (
            ContextLengthError("prompt has 300 tokens", "messages"),
            "context_length_exceeded",
            400,
            "context_length_exceeded",
        ),
        (
            ContextBudgetError("no room under --max-context", "max_tokens"),
            "context_over_budget",
            400,
            "context_over_budget",
        ),
        (
            PromptError("image parts need a vision model", "messages[0].content"),
            "invalid_request",
            400,
            None,
        ),
        (
            EngineRequestError("token id 999 is not in the vocabulary", "prompt"),
            "invalid_request",
            400,
            None,
        ),
    ],
)
def test_engine_request_errors_keep_message_and_param(
    exc: EngineRequestError, kind: str, status: int, code: str | None
) -> None:
    err = from_exception(exc)
    assert (err.kind, err.status, err.spec.code) == (kind, status, code)
    assert (err.message, err.param) == (exc.message, exc.param)


def test_a_full_queue_is_429_with_retry_after() -> None:
    err = from_exception(QueueFullError("8 requests already wait (--max-queue 8)"))
    assert (err.kind, err.status, err.headers) == ("queue_full", 429, {"Retry-After": "1"})
    assert openai_error_body(err) == {
        "error": {
            "message": "8 requests already wait (--max-queue 8)",
            "type": "resource_admission",
            "param": None,
            "code": "queue_full",
        }
    }


@pytest.mark.parametrize(
    ("exc", "kind", "message", "headers"),
    [
        (HTTPException(404), "not_found", "not found", {}),
        (
            HTTPException(405, headers={"Allow": "GET, HEAD"}),
            "method_not_allowed",
            "method not allowed",
            {"Allow": "GET, HEAD"},
        ),
        (
            HTTPException(401, "missing API key"),
            "unauthorized",
            "missing API key",
            {"WWW-Authenticate": "Bearer"},
        ),
        (
            HTTPException(413, "request body exceeds 10 bytes"),
            "payload_too_large",
            "request body exceeds 10 bytes",
            {},
        ),
        (HTTPException(418, "short and stout"), "invalid_request", "short and stout", {}),
        (HTTPException(503, "database on fire"), "server_error", INTERNAL_MESSAGE, {}),
        (
            ProblemException(
                status=415,
                detail="Invalid Content-type (text/plain), expected ['application/json']",
            ),
            "unsupported_media_type",
            "Content-Type 'text/plain' is not supported: send application/json",
            {},
        ),
        (
            ProblemException(
                status=400,
                title="Bad Request",
                detail="'x' is not of type 'integer'\n\nFailed validating 'type' in schema",
            ),
            "invalid_request",
            "'x' is not of type 'integer'",
            {},
        ),
        (ProblemException(status=400, title="Bad Request"), "invalid_request", "Bad Request", {}),
    ],
)
def test_http_errors_map_by_status(
    exc: Exception, kind: str, message: str, headers: dict[str, str]
) -> None:
    err = from_exception(exc)
    assert (err.kind, err.message, err.headers) == (kind, message, headers)


def test_from_status_matches_from_exception() -> None:
    assert from_status(404).message == "not found"
    assert from_status(405, "Method Not Allowed", {"Allow": "POST"}).headers == {"Allow": "POST"}
    assert from_status(405, "Method Not Allowed").headers == {}


def test_an_unexpected_exception_is_logged_and_never_leaked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.ERROR, logger="mlxspec.errors"):
        err = from_exception(KeyError("/home/me/secret.safetensors"))
    assert (err.kind, err.status, err.message) == ("server_error", 500, INTERNAL_MESSAGE)
    assert "secret" not in str(openai_error_body(err))
    (record,) = caplog.records
    assert record.exc_info is not None and record.exc_info[0] is KeyError


def test_unfinished_engine_requests() -> None:
    failed = from_failure(Failed("the engine ran out of memory"))
    assert (failed.kind, failed.status, failed.message) == (
        "server_error",
        500,
        "the engine ran out of memory",
    )
    cancelled = from_failure(Cancelled())
    assert (cancelled.kind, cancelled.message) == ("cancelled", "request cancelled")
    assert error_status(cancelled) == 499
    assert error_status(cancelled, "anthropic") == 499

"""Request bodies that are not valid JSON text, though Python's parser would take
them, are a 400 ``invalid JSON body`` in each surface's envelope: unpaired UTF-16
surrogates (the tokenizer raised TypeError, a 500) and numbers that overflow a
double. A surrogate pair and the largest finite numbers are fine.
"""

from __future__ import annotations

import httpx
import pytest

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


def assert_400(r: httpx.Response, param: str | None) -> str:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    return err["message"]


# --- unpaired UTF-16 surrogates: the tokenizer raised TypeError (a 500) -------


@pytest.mark.parametrize(
    "raw",
    [
        b'{"prompt": "\\ud800", "max_tokens": 2}',
        b'{"prompt": "a\\udfffb", "max_tokens": 2}',
    ],
)
def test_unpaired_surrogate_is_invalid_json(client: httpx.Client, raw: bytes) -> None:
    r = client.post(COMP, content=raw, headers={"Content-Type": "application/json"})
    assert "surrogate" in assert_400(r, None)


def test_unpaired_surrogate_in_chat_message_is_invalid_json(client: httpx.Client) -> None:
    raw = b'{"messages": [{"role": "user", "content": "x\\udc00"}], "max_tokens": 2}'
    r = client.post(CHAT, content=raw, headers={"Content-Type": "application/json"})
    assert_400(r, None)


def test_surrogate_pair_is_fine(client: httpx.Client) -> None:
    raw = b'{"prompt": "\\ud83d\\ude00", "max_tokens": 2}'
    r = client.post(COMP, content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "field",
    [
        '"temperature": 1e400',
        '"logit_bias": {"5": 1e400}',
        '"presence_penalty": 1e400',
        '"frequency_penalty": -1e309',
        '"repetition_penalty": ' + "9" * 400,
    ],
)
def test_overflowing_numbers_are_invalid_json_on_openai(client: httpx.Client, field: str) -> None:
    raw = '{"messages": [{"role": "user", "content": "hi"}], ' + field + "}"
    r = client.post(CHAT, content=raw, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json() == {
        "error": {
            "message": "invalid JSON body: number out of range",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_json",
        }
    }


def test_overflowing_numbers_in_each_surface_envelope(client: httpx.Client) -> None:
    h = {"content-type": "application/json"}
    r = client.post(COMP, content=b'{"prompt": "hi", "temperature": 1e400}', headers=h)
    assert (r.status_code, r.json()["error"]["message"]) == (
        400,
        "invalid JSON body: number out of range",
    )
    raw = b'{"model": "m", "max_tokens": 1, "temperature": -1e400, "messages": []}'
    r = client.post("/v1/messages", content=raw, headers=h)
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "invalid JSON body: number out of range",
        },
    }
    # System One answers invalid JSON as FastAPI does: 422 with a detail list.
    raw = b'{"model": "m", "state": "late", "questions": {}, "temperature": 1e999}'
    r = client.post("/v1/systemone", content=raw, headers=h)
    assert r.status_code == 422
    assert r.json() == {
        "detail": [
            {
                "loc": ["body"],
                "msg": "invalid JSON body: number out of range",
                "type": "value_error",
            }
        ]
    }


def test_finite_extremes_parse(client: httpx.Client) -> None:
    """The largest finite values are JSON: an uncapped field takes them, a ranged
    one names its range (tests/api/test_float_ranges.py), neither is invalid JSON."""
    head = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1'
    h = {"content-type": "application/json"}
    r = client.post(CHAT, content=head + ', "temperature": 1e308}', headers=h)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 1
    r = client.post(CHAT, content=head + ', "presence_penalty": 1e308}', headers=h)
    assert (r.status_code, r.json()["error"]["message"]) == (
        400,
        "presence_penalty must be between -2 and 2",
    )

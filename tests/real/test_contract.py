"""The response-contract checker on the embedded model's answers: the same checks
as the tiny live server's (``tests/api/test_contract.py``)."""

from __future__ import annotations

import httpx

CHAT = "/v1/chat/completions"


def test_real_server_responses_conform(real_client: httpx.Client) -> None:
    """The embedded model through the same checks (CPU decoding is slow: two tokens)."""
    assert real_client.get("/v1/models").status_code == 200
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "stream": True}
    assert real_client.post(CHAT, json=body).status_code == 200
    assert real_client.post(CHAT, json={"messages": []}).status_code == 400

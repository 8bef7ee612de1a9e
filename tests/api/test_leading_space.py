"""Raw text completions keep their leading space: a completion reads on from
its prompt, so a first token " t" is the text " t t", in both logprobs formats,
streamed and not, and with ``n`` > 1; a chat reply still drops it (mlx-lm's
answer convention). The real model's " Paris." is ``tests/real/test_completions.py``.
"""

from __future__ import annotations

import json

import httpx

CHAT, COMP = "/v1/chat/completions", "/v1/completions"
SPACE_T = 262  # the tiny model's merged token "Ġt", i.e. " t"
FORCE_SPACE_T = {str(SPACE_T): 100}


def _stream_text(r: httpx.Response) -> tuple[str, list[str], list[int]]:
    text, tokens, offsets = "", [], []
    for line in r.text.split("\n"):
        if line.startswith("data: {"):
            choice = json.loads(line[6:])["choices"][0]
            text += choice["text"]
            if choice["logprobs"]:
                tokens += choice["logprobs"]["tokens"]
                offsets += choice["logprobs"]["text_offset"]
    return text, tokens, offsets


def test_completion_keeps_the_leading_space(oclient: httpx.Client, client: httpx.Client) -> None:
    body = {"prompt": "hello", "max_tokens": 2, "logprobs": True, "logit_bias": FORCE_SPACE_T}
    choice = oclient.post(COMP, json=body).json()["choices"][0]
    assert choice["text"] == " t t"
    assert choice["logprobs"]["tokens"] == [" t", " t"]
    assert choice["logprobs"]["text_offset"] == [0, 2]
    streamed = oclient.post(COMP, json={**body, "stream": True})
    assert _stream_text(streamed) == (" t t", [" t", " t"], [0, 2])
    # The default format and n > 1 keep it too.
    many = client.post(COMP, json={**body, "n": 2}).json()["choices"]
    assert [c["text"] for c in many] == [" t t", " t t"]
    # A chat reply still starts without it (mlx-lm's answer convention).
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    reply = client.post(CHAT, json={**chat, "logit_bias": FORCE_SPACE_T}).json()
    assert reply["choices"][0]["message"]["content"] == "t t"

"""A raw text completion on the embedded model reads on from its prompt, leading
space included (``tests/api/test_leading_space.py`` pins the space exactly on
the tiny model)."""

from __future__ import annotations

import httpx
import pytest

COMP = "/v1/completions"


@pytest.mark.real_model
def test_real_completion_reads_on_from_the_prompt(real_client: httpx.Client) -> None:
    body = {"prompt": "The capital of France is", "max_tokens": 2, "temperature": 0}
    assert real_client.post(COMP, json=body).json()["choices"][0]["text"] == " Paris."

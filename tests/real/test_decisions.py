"""Decision scoring on the embedded model: the obvious answer wins
(``tests/api/test_decisions.py`` checks the numbers on the tiny model)."""

from __future__ import annotations

import httpx


def test_real_model_picks_the_obvious_answer(real_client: httpx.Client) -> None:
    # SmolLM2-135M leans towards the last listed answer; the right one goes first.
    body = {
        "model": "m",
        "input": "I love this product, it is wonderful!",
        "questions": [
            {
                "type": "choice",
                "name": "sentiment",
                "instructions": "What is the sentiment?",
                "choices": [{"value": "positive"}, {"value": "negative"}],
            }
        ],
    }
    r = real_client.post("/v1/decisions", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()["answers"][0]
    assert answer["choice"] == "positive"
    probabilities = [p["probability"] for p in answer["probabilities"]]
    assert probabilities[0] > 0.6
    assert abs(sum(probabilities) - 1) < 1e-5

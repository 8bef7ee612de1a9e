"""Structured output on the embedded SmolLM2 model, where it shows what a user
would rely on: a JSON Schema reply that validates, a guided choice, a regex
(``tests/api/test_structured_output.py`` shows the mask at work on the tiny model).
"""

from __future__ import annotations

import json
import re

import jsonschema

CHAT = "/v1/chat/completions"
COMP = "/v1/completions"


def schema_format(schema: dict, **extra: object) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, **extra}}


PET_SCHEMA = {
    "type": "object",
    "$defs": {
        "pet": {
            "type": "object",
            "properties": {
                "species": {"enum": ["cat", "dog", "fish"]},
                "age": {"type": "integer", "minimum": 0, "maximum": 30},
            },
            "required": ["species", "age"],
        }
    },
    "properties": {
        "owner": {"type": "string", "maxLength": 12},
        "pets": {"type": "array", "items": {"$ref": "#/$defs/pet"}, "minItems": 1, "maxItems": 2},
    },
    "required": ["owner", "pets"],
}


def test_real_json_schema_output_validates(real_client) -> None:
    messages = [
        {"role": "user", "content": "Anna has a 3 year old cat. Describe her pets as JSON."}
    ]
    body = {
        "messages": messages,
        "response_format": schema_format(PET_SCHEMA, strict=True, any_whitespace=False),
        "max_tokens": 48,
        "temperature": 0,
    }
    r = real_client.post(CHAT, json=body)
    choice = r.json()["choices"][0]
    jsonschema.validate(json.loads(choice["message"]["content"]), PET_SCHEMA)
    assert choice["finish_reason"] == "stop"


def test_real_guided_choice_yields_one_choice(real_client) -> None:
    messages = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]
    body = {"messages": messages, "guided_choice": ["yes", "no"], "max_tokens": 8}
    choice = real_client.post(CHAT, json=body).json()["choices"][0]
    assert choice["message"]["content"] in ("yes", "no")
    assert choice["finish_reason"] == "stop"


def test_real_regex(real_client) -> None:
    body = {
        "prompt": "The year the first moon landing happened was",
        "guided_regex": r"\d{4}\.",
        "max_tokens": 12,
        "temperature": 0,
    }
    choice = real_client.post(COMP, json=body).json()["choices"][0]
    assert re.fullmatch(r"\d{4}\.", choice["text"]), choice["text"]
    assert choice["finish_reason"] == "stop"

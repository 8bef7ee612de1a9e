"""``/v1/completions`` ``prompt`` in OpenAI's shapes of one prompt.

A string, an array of token ids (used as given), or a one-element array of
either; several prompts are a 400 whose message the document declares, and a
token id outside the vocabulary is a 400 naming ``prompt`` (never a 500).
The official ``openai`` SDK drives the live tiny server; its HTTP client and
the ``client`` fixture check every response against the document.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from mlxspec.conformance.hooks import trim_prompt
from mlxspec.engine import PromptError, token_prompt
from mlxspec.handlers.chat.completions import prompt_tokens

COMP = "/v1/completions"
TEXT = "hello there, the tortoise"
GREEDY = {"model": "tiny", "max_tokens": 8, "temperature": 0}
SHAPE = "prompt must be a string, an array of token ids, or a one-element array holding either"
SEVERAL = (
    "prompt holds several prompts, and one request takes one: send a request per prompt "
    "(n asks for several choices of one prompt)"
)
EMPTY = "prompt must not be empty"
NEGATIVE = "prompt token ids must be non-negative integers"


def _error(message: str, param: str | None) -> dict:
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": param,
            "code": None,
        }
    }


def _vocab(tiny_engine) -> int:
    return tiny_engine.info.vocab_size


# --- accepted shapes, through the SDK -----------------------------------------


def test_token_ids_and_their_text_give_the_same_completion(sdk, tiny_engine) -> None:
    ids = tiny_engine.text_prompt(TEXT)
    assert ids == list(tiny_engine.tokenizer.encode(TEXT)) and len(ids) > 5
    by_text = sdk.completions.create(prompt=TEXT, **GREEDY)
    by_ids = sdk.completions.create(prompt=ids, **GREEDY)
    assert by_ids.choices[0].text == by_text.choices[0].text
    assert by_ids.choices[0].finish_reason == by_text.choices[0].finish_reason
    assert by_ids.usage.prompt_tokens == by_text.usage.prompt_tokens == len(ids)
    assert by_ids.usage.completion_tokens == by_text.usage.completion_tokens
    assert by_ids.choices[0].index == 0 and len(by_ids.choices) == 1


def test_one_element_arrays_are_that_prompt(sdk, tiny_engine) -> None:
    ids = tiny_engine.text_prompt(TEXT)
    want = sdk.completions.create(prompt=TEXT, **GREEDY)
    for prompt in ([TEXT], [ids]):
        got = sdk.completions.create(prompt=prompt, **GREEDY)
        assert got.choices[0].text == want.choices[0].text, prompt
        assert got.usage.prompt_tokens == len(ids)


def test_token_ids_are_used_exactly_as_given(sdk, tiny_engine) -> None:
    # A prompt the tokenizer would never produce (unmerged "h", "e" and special
    # tokens): counted as sent, nothing added or merged.
    h, e = tiny_engine.tokenizer.convert_tokens_to_ids(["h", "e"])
    ids = [1, h, e, 2, 0, _vocab(tiny_engine) - 1]
    assert tiny_engine.text_prompt(tiny_engine.tokenizer.decode(ids)) != ids
    r = sdk.completions.create(prompt=ids, **GREEDY)
    assert r.usage.prompt_tokens == 6
    assert r.usage.total_tokens == 6 + r.usage.completion_tokens


def test_streamed_token_id_prompt_matches_the_text_prompt(sdk, tiny_engine) -> None:
    ids = tiny_engine.text_prompt(TEXT)
    want = sdk.completions.create(prompt=TEXT, **GREEDY)
    asked = {"stream": True, "stream_options": {"include_usage": True}}
    *chunks, usage = list(sdk.completions.create(prompt=ids, **asked, **GREEDY))
    assert "".join(c.choices[0].text for c in chunks) == want.choices[0].text
    assert usage.usage.prompt_tokens == len(ids)


def test_n_choices_on_a_token_id_prompt(sdk, tiny_engine) -> None:
    ids = tiny_engine.text_prompt(TEXT)
    r = sdk.completions.create(prompt=ids, n=2, **GREEDY)
    assert [c.index for c in r.choices] == [0, 1]
    assert r.choices[0].text == r.choices[1].text  # greedy choices are identical
    assert r.usage.prompt_tokens == len(ids)


# --- refused shapes: exact OpenAI errors --------------------------------------


@pytest.mark.parametrize(
    ("prompt", "message", "param"),
    [
        (["a", "b"], SEVERAL, "prompt"),
        ([[1, 2], [3]], SEVERAL, "prompt"),
        (["a", [1]], SEVERAL, "prompt"),
        ([], EMPTY, "prompt"),
        ("", EMPTY, "prompt"),
        ([""], EMPTY, "prompt[0]"),
        ([[]], EMPTY, "prompt[0]"),
        ([-1], NEGATIVE, "prompt[0]"),
        ([5, -3], NEGATIVE, "prompt[1]"),
        ([[7, -1]], NEGATIVE, "prompt[0][1]"),
        ([1.5], SHAPE, "prompt[0]"),
        ([True], SHAPE, "prompt[0]"),
        ([["a"]], SHAPE, "prompt[0][0]"),
        (["a", 5], SHAPE, "prompt[1]"),
        # the first bad member is named, not the last (jsonschema's best_match picked
        # prompt[1] here: a fresh user saw it)
        ([1.5, 2], SHAPE, "prompt[0]"),
        ([True, False], SHAPE, "prompt[0]"),
        ([-1, -2], NEGATIVE, "prompt[0]"),
        (5, SHAPE, "prompt"),
        ({"text": "a"}, SHAPE, "prompt"),
    ],
)
def test_refused_prompt_shapes(client: httpx.Client, prompt, message: str, param: str) -> None:
    r = client.post(COMP, json={"prompt": prompt, "max_tokens": 2})
    assert r.status_code == 400, r.text
    assert r.json() == _error(message, param)


def test_sdk_sees_several_prompts_as_a_bad_request(sdk) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(prompt=["first", "second"], **GREEDY)
    assert caught.value.status_code == 400
    assert caught.value.body == _error(SEVERAL, "prompt")["error"]


@pytest.mark.parametrize("offset", [0, 1, 10**30])
def test_token_id_outside_the_vocabulary_is_a_400(client, tiny_engine, offset: int) -> None:
    vocab = _vocab(tiny_engine)
    bad = vocab + offset
    message = f"prompt token {bad} is not a token id of this model (token ids are 0 to {vocab - 1})"
    for prompt in ([5, bad, 6], [[bad]]):
        r = client.post(COMP, json={"prompt": prompt, "max_tokens": 2})
        assert r.status_code == 400, r.text
        assert r.json() == _error(message, "prompt")
    # the server keeps serving
    ok = client.post(COMP, json={"prompt": [vocab - 1], "max_tokens": 2, "temperature": 0})
    assert ok.status_code == 200 and ok.json()["usage"]["prompt_tokens"] == 1


def test_over_long_token_id_prompt_is_a_context_error(client, tiny_engine) -> None:
    window = tiny_engine.info.context_window
    r = client.post(COMP, json={"prompt": [7] * (window + 1), "max_tokens": 1})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (err["param"], err["code"]) == ("prompt", "context_length_exceeded")


# --- the pure pieces -----------------------------------------------------------


def test_prompt_tokens_unwraps_one_prompt(tiny_engine) -> None:
    ids = tiny_engine.text_prompt(TEXT)
    assert prompt_tokens(tiny_engine, TEXT) == ids
    assert prompt_tokens(tiny_engine, [TEXT]) == ids
    assert prompt_tokens(tiny_engine, [ids]) == ids
    assert prompt_tokens(tiny_engine, [9]) == [9]  # one token id, not a wrapped prompt
    assert prompt_tokens(tiny_engine, ids) == ids


def test_token_prompt_bounds() -> None:
    assert token_prompt((0, 3, 9), 10) == [0, 3, 9]
    assert token_prompt([10**12], None) == [10**12]
    with pytest.raises(PromptError) as caught:
        token_prompt([0, 10], 10)
    assert (caught.value.message, caught.value.param) == (
        "prompt token 10 is not a token id of this model (token ids are 0 to 9)",
        "prompt",
    )
    with pytest.raises(PromptError) as caught:
        token_prompt([-2], None)
    assert caught.value.message == (
        "prompt token -2 is not a token id of this model (token ids are non-negative)"
    )


def test_fuzz_trim_cuts_token_id_prompts() -> None:
    assert trim_prompt({"prompt": list(range(10))}, budget=3) == {"prompt": [0, 1, 2]}
    assert trim_prompt({"prompt": [list(range(10))]}, budget=3) == {"prompt": [[0, 1, 2]]}
    assert trim_prompt({"prompt": ["abcdef"]}, budget=2) == {"prompt": ["ab"]}
    assert trim_prompt({"prompt": "abcdef"}, budget=4) == {"prompt": "abcd"}
    several = {"prompt": ["abcdef", "ghijkl"]}
    assert trim_prompt(several, budget=2) == several  # a 400 however long

"""Decision scoring: ``/v1/decisions`` and ``/v1/systemone``.

Tiers: the pure wire functions (confidence, answers, prompts); the engine's
teacher-forced log-likelihoods against a direct mlx-lm forward of the tiny
model; the routes on the tiny live server (every response checked against the
OpenAPI document). One request on the real embedded model is
``tests/real/test_decisions.py``.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from functools import partial

import httpx
import mlx.core as mx
import pytest

from mlxspec.engine import PromptError, scoring
from mlxspec.engine.scoring import answer_ending, loglikelihood_steps, softmax
from mlxspec.errors import ApiError
from mlxspec.handlers.decisions.wire import (
    answer_texts,
    confidence,
    parse_openai,
    parse_systemone,
    question_messages,
    render_answer,
)

QUESTION = {"type": "predicate", "name": "blue", "instructions": "Is the sky blue?"}
CHOICE = {
    "type": "choice",
    "instructions": "Which colour?",
    "choices": [{"value": "blue", "description": "like the sky"}, {"value": True}],
}
SCORE = {"type": "score", "instructions": "How blue?", "levels": [{"label": "a"}, {"label": "b"}]}


def direct_loglikelihood(model, prompt: list[int], answer: list[int]) -> float:
    """Sum of log_softmax over one full forward of prompt + answer (no cache)."""
    logits = model(mx.array(prompt + answer)[None]).astype(mx.float32)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    start = len(prompt) - 1
    return math.fsum(logprobs[0, start + j, t].item() for j, t in enumerate(answer))


# --- pure wire functions ----------------------------------------------------


def test_confidence_unordered_and_ordered() -> None:
    assert confidence([0.25, 0.25, 0.25, 0.25], ordered=False) == 0.0
    assert confidence([0.0, 1.0], ordered=False) == 1.0
    assert confidence([0.7, 0.2, 0.1], ordered=False) == pytest.approx((0.7 * 3 - 1) / 2)
    # best = 2; spread = 0.2 * 1 + 0.1 * 2 = 0.4; U = (1 + 0 + 1) / 3
    assert confidence([0.1, 0.2, 0.7], ordered=True) == pytest.approx(1 - 0.4 / (2 / 3))
    assert confidence([0.5, 0.0, 0.5], ordered=True) == 0.0  # clamped (1 - 1 / (2/3) < 0)
    assert confidence([1.0], ordered=True) == 1.0


def test_answers_in_both_shapes() -> None:
    request = parse_openai({"model": "m", "input": "x", "questions": [QUESTION, CHOICE, SCORE]})
    pred, choice, score = request.questions
    assert render_answer(pred, [0.2, 0.8], systemone=False) == {
        "type": "predicate",
        "name": "blue",
        "probability": 0.8,
    }
    assert render_answer(choice, [0.25, 0.75], systemone=False) == {
        "type": "choice",
        "name": None,
        "choice": True,
        "confidence": 0.5,
        "probabilities": [
            {"value": "blue", "probability": 0.25},
            {"value": True, "probability": 0.75},
        ],
    }
    assert render_answer(score, [0.25, 0.75], systemone=False) == {
        "type": "score",
        "name": None,
        "score": 0.75,
        "confidence": pytest.approx(1 - 0.25 / 0.5),
        "probabilities": [
            {"value": 0, "label": "a", "probability": 0.25},
            {"value": 1, "label": "b", "probability": 0.75},
        ],
    }
    body = {
        "model": "m",
        "state": "s",
        "questions": {
            "ok": {"type": "noul"},
            "pick": {"type": "choice", "criteria": {"x": "first", "y": None}},
            "lvl": {"type": "score", "criteria": ["low", {"n": 1}]},
        },
    }
    noul, pick, lvl = parse_systemone(body).questions
    assert render_answer(noul, [0.4, 0.6], systemone=True) == {"type": "noul", "noul": 0.6}
    assert render_answer(pick, [0.9, 0.1], systemone=True) == {
        "type": "choice",
        "choice": "x",
        "confidence": pytest.approx(0.8),
        "probabilities": {"x": 0.9, "y": 0.1},
    }
    assert render_answer(lvl, [0.5, 0.5], systemone=True) == {
        "type": "score",
        "score": 0.5,
        "confidence": 0.0,
        "legend": {"0": "low", "1": {"n": 1}},
        "probabilities": {"0": 0.5, "1": 0.5},
    }


def test_answer_texts_are_json_values() -> None:
    request = parse_openai({"model": "m", "input": "x", "questions": [QUESTION, CHOICE, SCORE]})
    assert [answer_texts(q) for q in request.questions] == [
        ["false", "true"],
        ['"blue"', "true"],
        ['"a"', '"b"'],
    ]
    lvl = parse_systemone(
        {
            "model": "m",
            "state": "s",
            "questions": {"l": {"type": "score", "criteria": [None, {"k": 1}]}},
        }
    ).questions[0]
    assert answer_texts(lvl) == ['"0"', '"{\\"k\\":1}"']  # null falls back to the index


def test_question_prompt_is_one_user_turn() -> None:
    body = {
        "model": "m",
        "input": [
            {"role": "user", "content": "one"},
            {"role": "user", "content": [{"type": "input_text", "text": "two"}]},
        ],
        "questions": [CHOICE],
    }
    request = parse_openai(body)
    assert question_messages(request, request.questions[0]) == [
        {
            "role": "user",
            "content": "one\n\ntwo\n\nConsider the input above.\nQuestion: Which colour?\n"
            'Possible answers:\n"blue" — like the sky\ntrue\n'
            "Reply with exactly one of the JSON values listed, and nothing else.",
        }
    ]


def test_systemone_state_json_and_asset_references() -> None:
    body = {
        "model": "m",
        "state": {"photo": "cat.png", "n": 1},
        "assets": {"cat.png": {"format": "png", "data_base64": "QUJD"}},
        "questions": {"q": {"type": "noul", "instructions": "Is it a cat?"}},
    }
    request = parse_systemone(body)
    assert request.input[0]["content"] == [
        {"type": "text", "text": '{"photo":"cat.png","n":1}'},
        {"type": "text", "text": "Image reference: cat.png"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,QUJD"}},
    ]
    with pytest.raises(ApiError) as err:
        parse_systemone({**body, "state": "no picture"})
    assert (err.value.message, err.value.param) == (
        "assets: every image asset must be referenced",
        "assets",
    )


def test_fuzz_hook_bounds_forward_requests_and_keeps_them_valid() -> None:
    from mlxspec.conformance.hooks import cheap_forward_body

    long = "z" * 500
    many = [{"value": f"v{i}"} for i in range(50)]
    body = {"model": "m", "input": long, "questions": [{**CHOICE, "choices": many}] * 9}
    assert cheap_forward_body(body) == {
        "model": "m",
        "input": "z" * 64,
        "questions": [{**CHOICE, "choices": many[:4]}] * 2,
    }
    asset = {"format": "png", "data_base64": "QUJD" * 40}
    systemone = {
        "state": long,
        "assets": {f"a{i}": asset for i in range(6)},
        "questions": {
            f"q{i}": {"type": "choice", "criteria": dict.fromkeys("abcdef", long)} for i in range(3)
        },
    }
    cheap = cheap_forward_body(systemone)
    assert list(cheap["assets"]) == ["a0", "a1", "a2", "a3"]
    assert cheap["assets"]["a0"] == asset  # base64 is never cut
    assert list(cheap["questions"]) == ["q0", "q1"]
    assert cheap["questions"]["q0"] == {
        "type": "choice",
        "criteria": dict.fromkeys("abcd", "z" * 64),
    }


# --- engine: log-likelihoods --------------------------------------------------


def test_answer_ending_is_chatml_end_of_turn(tiny_engine) -> None:
    assert answer_ending(tiny_engine.tokenizer) == "<|im_end|>"


class FakeTokenizer:
    """Just what ``answer_ending`` reads: a Jinja chat template and EOS ids."""

    def __init__(self, template: str | None, eos: dict[int, str]) -> None:
        self.chat_template, self._eos = template, eos
        self.eos_token_ids, self.eos_token_id = set(eos), min(eos) if eos else None

    def decode(self, ids: list[int]) -> str:
        return "".join(self._eos[i] for i in ids)

    def apply_chat_template(self, messages, add_generation_prompt, tokenize, **kwargs) -> str:
        import jinja2

        return jinja2.Template(self.chat_template).render(messages=messages, **kwargs)


GLM_STYLE = "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% endfor %}"
DROPS_ANSWERS = (
    "{% for m in messages %}{% if m.role == 'user' %}{{ m.content }}{% endif %}{% endfor %}"
)


def test_answer_ending_fallbacks() -> None:
    # The answer is closed only by the next turn's header, which is an EOS token.
    assert answer_ending(FakeTokenizer(GLM_STYLE, {5: "<|user|>"})) == "<|user|>"
    # No template: the EOS token's text.
    assert answer_ending(FakeTokenizer(None, {7: "</s>"})) == "</s>"
    with pytest.raises(PromptError, match="keeps assistant answers"):
        answer_ending(FakeTokenizer(DROPS_ANSWERS, {7: "</s>"}))


@pytest.mark.parametrize("shared_prefix", [True, False])
def test_loglikelihoods_match_direct_forward(tiny_engine, shared_prefix, monkeypatch) -> None:
    tok = tiny_engine.tokenizer
    prompt = tiny_engine.chat_prompt([{"role": "user", "content": "hello there"}])
    texts = ["true", "false", '"a much longer answer"', "x"]
    answers = [list(tok.encode(t + "<|im_end|>", add_special_tokens=False)) for t in texts]
    monkeypatch.setattr(scoring, "LOGIT_ROWS", 24)  # forces several candidate batches
    assert len(scoring._groups(answers, len(prompt))) > 1
    work = partial(loglikelihood_steps, tiny_engine.model, prompt, answers, shared_prefix)
    got = asyncio.run(tiny_engine.run_exclusive(work))
    expected = [direct_loglikelihood(tiny_engine.model, prompt, a) for a in answers]
    assert got == pytest.approx(expected, abs=1e-4)


def test_softmax_sums_to_one() -> None:
    probs = softmax([-151.3, -177.2, -614.1, -151.29])
    assert abs(sum(probs) - 1) < 1e-12
    assert probs[3] > probs[0] > probs[1] > probs[2] >= 0


# --- engine: run_exclusive --------------------------------------------------------


def test_run_exclusive_result_error_and_cancel(tiny_engine) -> None:
    gate, ran = threading.Event(), []

    def boom() -> None:
        raise ValueError("nope")

    async def scenario() -> None:
        assert await tiny_engine.run_exclusive(lambda: 41 + 1) == 42
        with pytest.raises(ValueError, match="nope"):
            await tiny_engine.run_exclusive(boom)
        blocker = asyncio.ensure_future(tiny_engine.run_exclusive(gate.wait))
        skipped = asyncio.ensure_future(tiny_engine.run_exclusive(lambda: ran.append(1)))
        await asyncio.sleep(0.05)
        skipped.cancel()  # still queued behind the blocker: it must never run
        await asyncio.sleep(0.05)  # the loop passes the cancellation on to the job
        gate.set()
        assert await blocker is True
        assert await tiny_engine.run_exclusive(lambda: "after") == "after"

    asyncio.run(scenario())
    assert ran == []


def test_scoring_pauses_after_each_prefill_chunk(tiny_engine) -> None:
    from mlxspec.engine.loop.lanes import default_prefill_step

    step = default_prefill_step()
    # Three prefill chunks and the last token, ids inside the tiny vocabulary.
    prompt = [5 + i % 50 for i in range(3 * step)]
    calls: list[int] = []

    class Counting:  # the tiny model, counting its forward passes
        def __getattr__(self, name: str):
            return getattr(tiny_engine.model, name)

        def __call__(self, tokens, cache):
            calls.append(tokens.shape[1])
            return tiny_engine.model(tokens, cache=cache)

    model = Counting()
    steps = loglikelihood_steps(model, prompt, [[1, 2]])
    next(steps)
    assert calls == [step]  # one chunk, then a pause
    next(steps)
    assert calls == [step, step]
    steps.close()  # the caller left: nothing more runs
    assert calls == [step, step]
    calls.clear()
    whole = partial(loglikelihood_steps, model, prompt, [[1, 2]])
    assert len(asyncio.run(tiny_engine.run_exclusive(whole))) == 1
    assert calls == [step, step, step - 1, 1, 1]  # 3 chunks, the last token, the candidate
    short = prompt[:9]  # within the tiny model's window: finite scores to compare
    got = asyncio.run(
        tiny_engine.run_exclusive(partial(loglikelihood_steps, model, short, [[1, 2]]))
    )
    assert got == pytest.approx([direct_loglikelihood(tiny_engine.model, short, [1, 2])], abs=1e-4)


def test_a_stepped_job_runs_beside_decoding_and_stops_when_its_caller_leaves(
    tiny_model_dir,
) -> None:
    from mlxspec.engine import Delta, Engine, GenerationRequest, LogitsParams

    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=4)
    engine.start()
    tokens: list[int] = []  # tokens the stream got, read at each step of the job
    closed: list[bool] = []

    def stepped(pauses: int | None):
        def run():
            seen = []
            try:
                for _ in range(pauses) if pauses is not None else iter(int, 1):
                    seen.append(len(tokens))
                    time.sleep(0.002)
                    yield
            finally:
                closed.append(True)
            return seen

        return run

    async def scenario() -> tuple[list[int], float]:
        prompt = tuple(engine.text_prompt("hello there"))
        request = GenerationRequest(prompt, max_tokens=200, logits=LogitsParams(((2, -1e9),)))

        async def stream() -> None:
            async for event in engine.submit(request):
                if isinstance(event, Delta):
                    tokens.append(1)

        streaming = asyncio.ensure_future(stream())
        while not tokens:
            await asyncio.sleep(0.001)
        seen = await engine.run_exclusive(stepped(40))
        forever = asyncio.ensure_future(engine.run_exclusive(stepped(None)))
        await asyncio.sleep(0.05)
        forever.cancel()
        started = time.monotonic()
        assert await engine.run_exclusive(lambda: "next") == "next"
        waited = time.monotonic() - started
        await streaming
        return seen, waited

    try:
        seen, waited = asyncio.run(scenario())
    finally:
        engine.close()
    assert len(seen) == 40
    assert seen[-1] > seen[0]  # the stream kept decoding between the job's steps
    assert closed == [True, True]  # the endless job was closed once its caller left
    assert waited < 5


# --- routes on the tiny model --------------------------------------------------


def test_decision_probabilities_match_hand_computed(client: httpx.Client, tiny_engine) -> None:
    body = {"model": "m", "input": "The sky is blue.", "questions": [QUESTION, CHOICE, SCORE]}
    r = client.post("/v1/decisions", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert data["model"] == "tiny-llama"
    pred, choice, score = data["answers"]
    for answer in (choice, score):
        assert abs(sum(p["probability"] for p in answer["probabilities"]) - 1) < 1e-5
    request = parse_openai(body)
    prompt = tiny_engine.chat_prompt(
        question_messages(request, request.questions[0]), template_kwargs={"enable_thinking": False}
    )
    tok = tiny_engine.tokenizer
    answers = [
        list(tok.encode(t + "<|im_end|>", add_special_tokens=False)) for t in ("false", "true")
    ]
    lls = [direct_loglikelihood(tiny_engine.model, prompt, a) for a in answers]
    assert pred["probability"] == pytest.approx(softmax(lls)[1], abs=1e-5)
    assert 0 <= pred["probability"] <= 1
    best = max(choice["probabilities"], key=lambda p: p["probability"])
    assert choice["choice"] == best["value"]
    assert score["score"] == pytest.approx(
        sum(p["value"] * p["probability"] for p in score["probabilities"])
    )
    used = 0
    for question in request.questions:
        messages = question_messages(request, question)
        length = len(tiny_engine.chat_prompt(messages, template_kwargs={"enable_thinking": False}))
        for text in answer_texts(question):
            used += length + len(tok.encode(text + "<|im_end|>", add_special_tokens=False)) - 1
    assert data["usage"] == {
        "input_tokens": used,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": used,
    }


def test_systemone_answers_keyed_by_name(client: httpx.Client) -> None:
    body = {
        "model": "m",
        "state": {"ticket": "late"},
        "questions": {
            "late": {"type": "noul", "instructions": "Is it late?", "criteria": {"true": "yes"}},
            "team": {"type": "choice", "criteria": {"billing": "money", "shipping": None}},
        },
    }
    r = client.post("/v1/systemone", json=body)
    assert r.status_code == 200, r.text
    data = r.json()
    assert list(data["answers"]) == ["late", "team"]
    assert data["answers"]["late"]["type"] == "noul"
    team = data["answers"]["team"]
    assert abs(sum(team["probabilities"].values()) - 1) < 1e-5
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert set(data["usage"]) == {"input_tokens", "output_tokens"}


def test_client_leaving_a_queued_decision_skips_its_scoring(
    client: httpx.Client, tiny_engine, monkeypatch
) -> None:
    calls: list[int] = []
    real = scoring.loglikelihood_steps  # what score_answers runs on the engine thread
    monkeypatch.setattr(
        scoring, "loglikelihood_steps", lambda *a, **k: calls.append(1) or real(*a, **k)
    )
    gate = threading.Event()
    blocker = threading.Thread(target=lambda: asyncio.run(tiny_engine.run_exclusive(gate.wait)))
    blocker.start()  # the engine thread is now busy until the gate opens
    try:
        body = {"model": "m", "input": "x", "questions": [QUESTION]}
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{client.base_url}/v1/decisions", json=body, timeout=1.0)
        time.sleep(0.5)  # the server notices the disconnect and cancels the queued job
    finally:
        gate.set()
        blocker.join(10)
    asyncio.run(tiny_engine.run_exclusive(lambda: None))  # everything queued before has run
    assert calls == []


OPENAI_ERRORS = [
    ([1], "body", "body: must be an object"),
    ({"input": "x", "questions": [QUESTION]}, "model", "model: must be a string"),
    (
        {"model": "m", "questions": [QUESTION]},
        "input",
        "input: must contain 1–9007199254740991 entries",
    ),
    (
        {"model": "m", "input": None, "questions": [QUESTION]},
        "input",
        "input: must contain 1–9007199254740991 entries",
    ),
    (
        {"model": "m", "input": [], "questions": [QUESTION]},
        "input",
        "input: must contain 1–9007199254740991 entries",
    ),
    # a bad member of the array is named by its own message, as the reference does
    # (a fresh user got the array's "must contain" message for ["a", "b"])
    (
        {"model": "m", "input": ["a", "b"], "questions": [QUESTION]},
        "input.0",
        "input.0: must be an object",
    ),
    (
        {"model": "m", "input": [{"role": "assistant", "content": "x"}], "questions": [QUESTION]},
        "input.0.role",  # the reference names input.0
        "input.0.role: must be a user message",
    ),
    (
        {"model": "m", "input": [{"role": "user", "content": []}], "questions": [QUESTION]},
        "input.0.content",
        "input.0.content: must contain 1–9007199254740991 entries",
    ),
    (
        {"model": "m", "input": "x", "questions": []},
        "questions",
        "questions: must contain 1–200 entries",
    ),
    (
        {"model": "m", "input": "x", "questions": [{"type": "bool", "instructions": "a"}]},
        "questions.0.type",
        "questions.0.type: expected predicate, choice, or score",
    ),
    (
        {"model": "m", "input": "x", "questions": [{"type": "predicate"}]},
        "questions.0.instructions",
        "questions.0.instructions: must be a string",
    ),
    (
        {"model": "m", "input": "x", "questions": [{**CHOICE, "choices": [{"value": "a"}]}]},
        "questions.0.choices",
        "questions.0.choices: must contain 2–255 entries",
    ),
    (
        {
            "model": "m",
            "input": "x",
            "questions": [{**CHOICE, "choices": [{"value": 1}, {"value": "a"}]}],
        },
        "questions.0.choices.0.value",
        "questions.0.choices.0.value: must be a string or boolean",
    ),
    (
        {
            "model": "m",
            "input": "x",
            "questions": [{**CHOICE, "choices": [{"value": "a"}, {"value": "a"}]}],
        },
        "questions.0.choices",
        "questions.0.choices: values must be unique (strings and booleans are distinct)",
    ),
    (
        {"model": "m", "input": "x", "questions": [{**SCORE, "levels": [{"label": "a"}, {}]}]},
        "questions.0.levels.1.label",
        "questions.0.levels.1.label: must be a string",
    ),
    (
        {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "audio"}]}],
            "questions": [QUESTION],
        },
        "input.0.content.0.type",
        "input.0.content.0.type: expected input_text or input_image",
    ),
    (
        {
            "model": "m",
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "u", "detail": "x"}],
                }
            ],
            "questions": [QUESTION],
        },
        "input.0.content.0.detail",
        "input.0.content.0.detail: invalid image detail",
    ),
    (
        {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}]
            * 129,
            "questions": [QUESTION],
        },
        "input",
        "input: supports at most 128 images",
    ),
    (
        {
            "model": "m",
            "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "u"}]}],
            "questions": [QUESTION],
        },
        "input",
        "model tiny-llama is text-only: 'image_url' content parts are not supported",
    ),
]


@pytest.mark.parametrize(("body", "param", "message"), OPENAI_ERRORS)
def test_decision_errors(client: httpx.Client, body, param, message) -> None:
    r = client.post("/v1/decisions", json=body)
    assert r.status_code == 400, r.text
    assert r.json() == {
        "error": {"message": message, "type": "invalid_request_error", "param": param, "code": None}
    }


SYSTEMONE_ERRORS = [
    (
        {"model": "m", "state": 5, "questions": {"q": {"type": "noul"}}},
        "state",
        "must be text, an object, or an array",
    ),
    (
        {"model": "m", "state": "s", "questions": {}},
        "questions",
        "must contain at least one question",
    ),
    (
        {"model": "m", "state": "s", "questions": {"q": {"type": "predicate"}}},
        "questions.q.type",
        "expected noul, choice, or score",
    ),
    (
        {"model": "m", "state": "s", "questions": {"q": {"type": "choice"}}},
        "questions.q.criteria",
        "must be an object",
    ),
    (
        {"model": "m", "state": "s", "questions": {"q": {"type": "choice", "criteria": {}}}},
        "questions.q.criteria",
        "requires 1–255 options",
    ),
    (
        {"model": "m", "state": "s", "questions": {"q": {"type": "score", "criteria": ["a"]}}},
        "questions.q.criteria",
        "must contain 2–10 entries",
    ),
    (
        {"model": "m", "state": "s", "questions": {"q": {"type": "score", "criteria": ["a", 2]}}},
        "questions.q.criteria.1",
        "must be text, an object, or an array",
    ),
    (
        {
            "model": "m",
            "state": "s",
            "assets": {"a": {"format": "gif", "data_base64": "QUJD"}},
            "questions": {"q": {"type": "noul"}},
        },
        "assets.a.format",
        "expected png, jpg, or jpeg",
    ),
    (
        {
            "model": "m",
            "state": "s",
            "assets": {"a": {"format": "png", "data_base64": "QUJ"}},
            "questions": {"q": {"type": "noul"}},
        },
        "assets.a.data_base64",
        "invalid base64 image",
    ),
    (
        {
            "model": "m",
            "state": "s",
            "assets": {"a": {"format": "png", "data_base64": "QUJD"}},
            "questions": {"q": {"type": "noul"}},
        },
        "assets",
        "every image asset must be referenced",
    ),
    (
        {
            "model": "m",
            "state": [
                [
                    [
                        [
                            [
                                [
                                    [
                                        [
                                            [
                                                [
                                                    [
                                                        [
                                                            [
                                                                [
                                                                    [
                                                                        [
                                                                            [
                                                                                [
                                                                                    [
                                                                                        [
                                                                                            [
                                                                                                [
                                                                                                    [
                                                                                                        [
                                                                                                            [
                                                                                                                [
                                                                                                                    [
                                                                                                                        [
                                                                                                                            [
                                                                                                                                [
                                                                                                                                    [
                                                                                                                                        [
                                                                                                                                            [
                                                                                                                                                [
                                                                                                                                                    [
                                                                                                                                                        [
                                                                                                                                                            [
                                                                                                                                                                [
                                                                                                                                                                    [
                                                                                                                                                                        [
                                                                                                                                                                            [
                                                                                                                                                                                [
                                                                                                                                                                                    [
                                                                                                                                                                                        [
                                                                                                                                                                                            [
                                                                                                                                                                                                [
                                                                                                                                                                                                    [
                                                                                                                                                                                                        [
                                                                                                                                                                                                            [
                                                                                                                                                                                                                [
                                                                                                                                                                                                                    [
                                                                                                                                                                                                                        [
                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                        [
                                                                                                                                                                                                                                                                            [
                                                                                                                                                                                                                                                                                [
                                                                                                                                                                                                                                                                                    [
                                                                                                                                                                                                                                                                                        []
                                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                                ]
                                                                                                                                                                                                                            ]
                                                                                                                                                                                                                        ]
                                                                                                                                                                                                                    ]
                                                                                                                                                                                                                ]
                                                                                                                                                                                                            ]
                                                                                                                                                                                                        ]
                                                                                                                                                                                                    ]
                                                                                                                                                                                                ]
                                                                                                                                                                                            ]
                                                                                                                                                                                        ]
                                                                                                                                                                                    ]
                                                                                                                                                                                ]
                                                                                                                                                                            ]
                                                                                                                                                                        ]
                                                                                                                                                                    ]
                                                                                                                                                                ]
                                                                                                                                                            ]
                                                                                                                                                        ]
                                                                                                                                                    ]
                                                                                                                                                ]
                                                                                                                                            ]
                                                                                                                                        ]
                                                                                                                                    ]
                                                                                                                                ]
                                                                                                                            ]
                                                                                                                        ]
                                                                                                                    ]
                                                                                                                ]
                                                                                                            ]
                                                                                                        ]
                                                                                                    ]
                                                                                                ]
                                                                                            ]
                                                                                        ]
                                                                                    ]
                                                                                ]
                                                                            ]
                                                                        ]
                                                                    ]
                                                                ]
                                                            ]
                                                        ]
                                                    ]
                                                ]
                                            ]
                                        ]
                                    ]
                                ]
                            ]
                        ]
                    ]
                ]
            ],
            "questions": {"q": {"type": "noul"}},
        },
        "state",
        "exceeds 64 nested levels",
    ),
]


@pytest.mark.parametrize(("body", "field", "message"), SYSTEMONE_ERRORS)
def test_systemone_errors_are_422_details(client: httpx.Client, body, field, message) -> None:
    r = client.post("/v1/systemone", json=body)
    assert r.status_code == 422, r.text
    loc = ["body", *field.split(".")]
    assert r.json() == {
        "detail": [{"loc": loc, "msg": f"{field}: {message}", "type": "value_error"}]
    }


def test_systemone_non_validation_errors_keep_openai_shape(client: httpx.Client) -> None:
    body = {"model": "m", "state": "word " * 300, "questions": {"q": {"type": "noul"}}}
    r = client.post("/v1/systemone", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert (error["type"], error["code"], error["param"]) == (
        "invalid_request_error",
        "context_length_exceeded",
        None,
    )
    assert error["message"].startswith("This model's maximum context length is 256 tokens")

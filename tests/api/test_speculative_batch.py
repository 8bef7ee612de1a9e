"""Speculative decoding inside mlxspec's batched decode step
(``engine/speculative/``, ``loop/verify_step.py``) on the tiny random model:
greedy rows with prompt-lookup drafts emit token for token what they emit
without drafts, alone and eight at once, with logprobs equal to the plain
step's; rows that cannot speculate decode beside them unchanged; the KV cache
drops each row's rejected drafts; budgets hold inside an accepted run."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mlxspec.engine import Engine, GenerationRequest, LogitsParams
from mlxspec.engine.loop.decode import DecodeBatch, Slot, Token
from mlxspec.engine.loop.handles import RequestHandle
from mlxspec.engine.loop.lanes import Handoff
from mlxspec.engine.loop.rows import Row
from mlxspec.engine.sampling.sampler import build_logits_processors, build_sampler
from mlxspec.engine.speculative import NgramDrafts, SpecCounts, Speculator, speculable

NO_EOS = LogitsParams()  # the rows here have no EOS (Row eos=frozenset())
LOOP = asyncio.new_event_loop()

#: Prompts that repeat themselves, so prompt lookup finds drafts.
PROMPTS = [
    "one two three four one two three four one two three four one two",
    "the cat sat on the mat and the cat sat on the mat and the cat",
    "a b c d e f a b c d e f a b c",
    "hello hello hello hello hello",
    "x y x y x y x y x y x y",
    "red green blue red green blue red green",
    "alpha beta gamma alpha beta gamma alpha",
    "to be or not to be or not to be or not",
]


@pytest.fixture(scope="module", autouse=True)
def _close_loop():
    yield
    LOOP.close()


@pytest.fixture(scope="module")
def engine(tiny_engine):
    return tiny_engine


def _handoff(
    engine: Engine, prompt: tuple[int, ...], max_tokens: int, spec: bool, logits=None, **kw: Any
) -> Handoff:
    request = GenerationRequest(
        prompt, max_tokens=max_tokens, logits=logits or LogitsParams(), logprobs=True, **kw
    )
    handle = RequestHandle(request, LOOP)
    row = Row(handle, engine.tokenizer, frozenset(), lane="batched")
    if spec and speculable(request):
        row.spec = SpecCounts()
    return Handoff(
        row=row,
        feed=list(prompt),
        held=[],
        cache=None,
        max_tokens=max_tokens,
        sampler=build_sampler(request.sampling, []),
        processors=build_logits_processors(request.logits),
    )


def _run(engine: Engine, cases, speculator: Speculator | None, stagger: bool = False):
    """Decode ``cases`` ((prompt text, max tokens, logits)) in one DecodeBatch;
    returns per row (tokens, logprob values, spec counts) and the step count."""
    batch = DecodeBatch(engine.model, prefill_step=8, max_rows=8, speculator=speculator)
    slots: list[Slot] = []
    got: dict[int, list[int]] = {}
    values: dict[int, list[float]] = {}

    def add(i: int) -> None:
        text, n, logits = cases[i]
        prompt = tuple(engine.text_prompt(text))
        slot = batch.add(_handoff(engine, prompt, n, speculator is not None, logits))
        slots.append(slot)
        got[id(slot)], values[id(slot)] = [], []

    def route(tokens: list[Token]) -> None:
        done = []
        for t in tokens:
            if t.slot in done:
                continue
            got[id(t.slot)].append(t.id)
            assert t.logprobs is not None
            values[id(t.slot)].append(t.logprobs.value)
            if t.count >= t.slot.budget:
                done.append(t.slot)
        batch.remove(done)

    first = len(cases) // 2 if stagger else len(cases)
    for i in range(first):
        add(i)
    steps = 0
    while len(batch):
        if stagger and steps == 2:
            for i in range(first, len(cases)):
                add(i)
        batch.step(route)
        steps += 1
    return [(got[id(s)], values[id(s)], s.row.spec) for s in slots], steps


def _ngram(k: int = 4) -> Speculator:
    return Speculator(NgramDrafts(), k)


def test_ngram_greedy_alone_equals_plain_decoding(engine) -> None:
    cases = [(PROMPTS[0], 24, NO_EOS)]

    def work():
        return _run(engine, cases, None), _run(engine, cases, spec := _ngram()), spec

    (plain, plain_steps), (fast, fast_steps), spec = asyncio.run(engine.run_exclusive(work))
    assert fast[0][0] == plain[0][0]
    assert len(fast[0][0]) == 24
    assert fast[0][1] == pytest.approx(plain[0][1], abs=1e-4)
    counts = fast[0][2]
    assert counts.drafted > 0 and counts.accepted > 0  # lookup drafts were kept
    assert counts.target_calls + counts.accepted == 24  # each call gives 1 + its kept drafts
    assert fast_steps < plain_steps
    assert spec.stats.accepted == counts.accepted


def test_ngram_greedy_batch_of_eight_equals_plain_decoding(engine) -> None:
    cases = [(p, 10 + 3 * i, NO_EOS) for i, p in enumerate(PROMPTS)]

    def work():
        return _run(engine, cases, None, stagger=True), _run(engine, cases, _ngram(), True)

    (plain, _), (fast, _) = asyncio.run(engine.run_exclusive(work))
    for (want, want_lp, _), (got, got_lp, counts), (_, n, _) in zip(
        plain, fast, cases, strict=True
    ):
        assert got == want
        assert len(got) == n  # never past max_tokens, even inside an accepted run
        assert got_lp == pytest.approx(want_lp, abs=1e-4)
        assert counts.target_calls + counts.accepted == n
    assert sum(c.accepted for _, _, c in fast) > 0


def test_rows_that_cannot_speculate_decode_beside_unchanged(engine) -> None:
    penalised = LogitsParams(logit_bias=((2, -1e9),), repetition_penalty=1.3)
    cases = [(PROMPTS[0], 16, NO_EOS), (PROMPTS[1], 16, penalised), (PROMPTS[2], 16, NO_EOS)]

    def work():
        return _run(engine, cases, None), _run(engine, cases, _ngram())

    (plain, _), (fast, _) = asyncio.run(engine.run_exclusive(work))
    assert [t for t, _, _ in fast] == [t for t, _, _ in plain]
    assert fast[1][2] is None  # penalties: no drafts for it
    assert fast[0][2] is not None and fast[0][2].accepted > 0


@pytest.fixture(scope="module")
def same_draft(engine, tiny_model_dir):
    """The tiny model drafting for itself: greedy drafts always pass."""
    from mlxspec.engine.speculative.draft_model import DraftModel

    return DraftModel.load(tiny_model_dir, engine.model, engine.tokenizer)


@pytest.fixture(scope="module")
def other_draft(engine, tiny_model_dir):
    """Another random tiny model of the same shape, without the fixture's
    scaled-up embeddings (which make every tiny model echo its last token): its
    drafts pass sometimes."""
    import json

    import mlx.core as mx
    from mlx_lm.models.llama import Model, ModelArgs

    from mlxspec.engine.speculative.draft_model import DraftModel

    config = json.loads((tiny_model_dir / "config.json").read_text())
    mx.random.seed(7)
    model = Model(ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    return DraftModel(model)


@pytest.mark.parametrize("which", ["same_draft", "other_draft"])
def test_draft_model_greedy_batch_equals_plain_decoding(engine, which, request) -> None:
    source = request.getfixturevalue(which)
    penalised = LogitsParams(repetition_penalty=1.3)
    cases = [(p, 9 + 2 * i, NO_EOS) for i, p in enumerate(PROMPTS)]
    cases[3] = (PROMPTS[3], 12, penalised)  # one row that cannot speculate, beside them

    def work():
        plain = _run(engine, cases, None, stagger=True)
        alone = _run(engine, cases[:1], Speculator(source, 4))
        return plain, _run(engine, cases, spec := Speculator(source, 4), True), alone, spec

    (plain, plain_steps), (fast, fast_steps), (alone, _), spec = asyncio.run(
        engine.run_exclusive(work)
    )
    assert [t for t, _, _ in fast] == [t for t, _, _ in plain]
    assert alone[0][0] == plain[0][0]
    for (_, want_lp, _), (got, got_lp, counts), (_, n, logits) in zip(
        plain, fast, cases, strict=True
    ):
        assert len(got) == n
        assert got_lp == pytest.approx(want_lp, abs=1e-4)
        if logits is penalised:
            assert counts is None
        else:
            assert counts.target_calls + counts.accepted == n
    kept = sum(c.accepted for _, _, c in fast if c is not None)
    drafted = sum(c.drafted for _, _, c in fast if c is not None)
    assert spec.stats.accepted == kept and spec.stats.drafted == drafted
    if which == "same_draft":
        assert kept == drafted  # a model agrees with itself
        assert fast_steps < plain_steps
    else:
        assert 0 <= kept < drafted


def test_a_draft_with_another_tokenizer_is_refused(engine, tmp_path_factory) -> None:
    from fixtures.tiny_model import build_tiny_llama
    from mlxspec.engine.speculative import SpeculationError
    from mlxspec.engine.speculative.draft_model import DraftModel

    folder = build_tiny_llama(
        tmp_path_factory.mktemp("draft") / "vocab", extra_tokens=("<extra_a>", "<extra_b>")
    )
    with pytest.raises(SpeculationError, match="^--draft-model: .* another tokenizer"):
        DraftModel.load(folder, engine.model, engine.tokenizer)


def test_kv_kept_after_verify_steps_is_that_of_the_tokens(engine, other_draft) -> None:
    """Rows that rejected different numbers of drafts were rewound each to its
    own kept tokens: each row's KV cache (what the prompt cache keeps) equals
    a fresh prefill of exactly the tokens it claims to hold."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cases = [(p, 40, NO_EOS) for p in PROMPTS[:4]]

    def work():
        spec = Speculator(other_draft, 4)
        batch = DecodeBatch(engine.model, prefill_step=8, max_rows=8, speculator=spec)
        slots = []
        for text, n, _ in cases:
            prompt = tuple(engine.text_prompt(text))
            slots.append(batch.add(_handoff(engine, prompt, n, True)))
        for _ in range(12):
            batch.step(lambda tokens: None)
        assert spec.stats.verify_steps > 0 and spec.stats.accepted < spec.stats.drafted
        out = []
        for slot in slots:
            cache, tokens = batch.extract(slot)
            fresh = make_prompt_cache(engine.model)
            engine.model(mx.array(tokens, dtype=mx.uint32)[None], cache=fresh)
            for got, want in zip(cache, fresh, strict=True):
                assert got.keys.shape[2] == len(tokens) == want.offset
                out.append(mx.abs(got.keys - want.keys[..., : len(tokens), :]).max().item())
                out.append(mx.abs(got.values - want.values[..., : len(tokens), :]).max().item())
        return out

    diffs = asyncio.run(engine.run_exclusive(work))
    assert max(diffs) < 1e-3

"""Grammar-constrained decoding in the engine (mlxspec.engine.sampling.grammar): the
compile cache, the logits mask, and enforcement on both lanes of the tiny
random-weight model, whose unconstrained output is meaningless text."""

from __future__ import annotations

import asyncio
import json
import math
import re

import jsonschema
import numpy as np
import pytest

from mlxspec.engine import (
    Constraint,
    Delta,
    Engine,
    Failed,
    Finished,
    GenerationRequest,
    LogitsParams,
    SamplingParams,
)
from mlxspec.engine.loop.rows import LOGPROB_FLOOR
from mlxspec.engine.sampling.grammar import (
    GRAMMAR_DISABLED,
    GrammarCache,
    GrammarError,
    choice_ebnf,
)
from mlxspec.engine.sampling.grammar_sandbox import CompileSandbox

#: Bounded JSON (enums, small integers, booleans, a $ref) so a random model
#: must finish it within a few dozen tokens.
SCHEMA = {
    "type": "object",
    "$defs": {"size": {"enum": ["S", "M", "L"]}},
    "properties": {
        "kind": {"enum": ["cat", "dog"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "size": {"$ref": "#/$defs/size"},
    },
    "required": ["kind", "age", "ok", "size"],
}
JSON_SCHEMA = Constraint("json_schema", json.dumps(SCHEMA), any_whitespace=False)
REGEX = Constraint("regex", "[a-z]{3}-[0-9]{2}")
CHOICE = Constraint("choice", json.dumps(["yes", "no", "maybe"]))
BAD_EBNF_REASON = 'EBNF parser error at line 1, column 10: Rule "foo" is not defined'


def check_output(constraint: Constraint, text: str) -> None:
    """Assert ``text`` is in the constraint's language."""
    if constraint.kind == "json_schema":
        jsonschema.validate(json.loads(text), json.loads(constraint.spec))
    elif constraint.kind == "regex":
        assert re.fullmatch(constraint.spec, text), text
    else:
        assert text in json.loads(constraint.spec)


def replay(engine: Engine, constraint: Constraint, ids: list[int]) -> bool:
    """Feed ``ids`` to a fresh matcher: True if every one is allowed and the
    grammar is then complete."""
    import xgrammar as xgr

    matcher = xgr.GrammarMatcher(engine.grammars.compile(constraint))
    return all(matcher.accept_token(i) for i in ids) and matcher.is_completed()


async def generate(engine: Engine, request: GenerationRequest) -> tuple[str, list, list, Finished]:
    text, ids, lps, fin = "", [], [], None
    async for ev in engine.submit(request):
        assert not isinstance(ev, Failed), ev
        if isinstance(ev, Delta):
            text, ids, lps = text + ev.text, ids + list(ev.token_ids), lps + list(ev.logprobs)
        elif isinstance(ev, Finished):
            fin = ev
    return text, ids, lps, fin


def run(engine: Engine, request: GenerationRequest) -> tuple[str, list, list, Finished]:
    return asyncio.run(generate(engine, request))


def token_id(engine: Engine, piece: str) -> int:
    return engine.tokenizer.convert_tokens_to_ids(piece)


@pytest.fixture(scope="module")
def serial_engine(tiny_model_dir):
    engine = Engine.load(tiny_model_dir, "tiny-llama", max_batch=1)
    engine.start()
    yield engine
    engine.close()


@pytest.fixture()
def cache(tiny_engine) -> GrammarCache:
    return GrammarCache(tiny_engine.tokenizer, tiny_engine.info.vocab_size, {2}, capacity=2)


# ----------------------------------------------------------------- the cache
def test_choice_ebnf_escapes_quotes_backslashes_and_newlines() -> None:
    assert choice_ebnf(['a"b', "c\\d", "x\ny", "é"]) == (
        'root ::= "a\\"b" | "c\\\\d" | "x\\ny" | "é"'
    )


def test_cache_returns_the_same_compiled_grammar(cache: GrammarCache) -> None:
    first = cache.compile(REGEX)
    assert cache.compile(Constraint("regex", REGEX.spec)) is first
    assert (cache.hits, cache.misses, len(cache)) == (1, 1, 1)


def test_cache_key_includes_any_whitespace(cache: GrammarCache) -> None:
    compact = cache.compile(JSON_SCHEMA)
    spaced = cache.compile(Constraint("json_schema", JSON_SCHEMA.spec, any_whitespace=True))
    assert compact is not spaced
    assert (cache.hits, cache.misses) == (0, 2)


def test_cache_evicts_the_least_recently_used(cache: GrammarCache) -> None:
    cache.compile(REGEX)
    cache.compile(CHOICE)
    cache.compile(REGEX)  # REGEX is now the most recent
    cache.compile(JSON_SCHEMA)  # evicts CHOICE
    assert len(cache) == 2
    cache.compile(REGEX)
    assert cache.misses == 3
    cache.compile(CHOICE)
    assert (cache.hits, cache.misses) == (2, 4)


def test_compile_failure_has_a_clean_reason_and_is_cached(cache: GrammarCache) -> None:
    bad = Constraint("ebnf", "root ::= foo")
    for _ in range(2):
        with pytest.raises(GrammarError) as info:
            cache.compile(bad)
        assert info.value.reason == BAD_EBNF_REASON
    assert (cache.hits, cache.misses) == (1, 1)
    assert cache.problem(bad) == info.value.reason
    assert cache.problem(REGEX) is None


def test_grammar_that_crashes_xgrammar_is_refused_not_fatal(cache: GrammarCache) -> None:
    # Segfaults xgrammar 0.2.9's compiler; the sandbox child dies instead of us.
    crasher = Constraint("ebnf", "root ::= root{2,}")
    assert cache.problem(crasher) == "the grammar compiler crashed on this grammar"
    assert cache.problem(REGEX) is None  # a fresh child serves the next compile


def test_sandbox_timeout_kills_and_restarts_the_child(tiny_engine) -> None:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tiny_engine.tokenizer._tokenizer)
    sandbox = CompileSandbox(info.serialize_json(), timeout=0.0)
    try:
        assert sandbox.check("regex", "[a-z]+", True) == "grammar compilation took longer than 0 s"
        sandbox.timeout = 60.0
        assert sandbox.check("regex", "[a-z]+", True) is None
        assert sandbox.check("regex", "(", True) == (
            "Regex parsing error at position 2: The parenthesis is not closed."
        )
    finally:
        sandbox.close()


@pytest.mark.parametrize("spec", ["[]", '["a", 1]', "{}", "not json"])
def test_bad_choice_spec(cache: GrammarCache, spec: str) -> None:
    reason = cache.problem(Constraint("choice", spec))
    assert reason == "choice constraint is not a non-empty JSON array of strings"


def test_disabled_cache_refuses_every_constraint(tiny_engine) -> None:
    off = GrammarCache(tiny_engine.tokenizer, enabled=False)
    assert off.problem(Constraint("json_object")) == GRAMMAR_DISABLED
    assert GRAMMAR_DISABLED == "grammar compilation disabled by MLXSPEC_GRAMMAR=0"
    assert off.for_request(Constraint("json_object")) is None
    assert off.for_request(None) is None


# ------------------------------------------------------------------ the mask
def test_mask_keeps_exactly_the_allowed_tokens_untouched(tiny_engine, cache) -> None:
    import mlx.core as mx

    proc = cache.processor(Constraint("regex", "[0-9]+"))
    vocab = tiny_engine.info.vocab_size
    logits = mx.random.normal((1, vocab))
    out = proc(mx.array([5, 6]), logits)
    finite = np.nonzero(np.isfinite(np.array(out[0])))[0].tolist()
    assert finite == sorted(token_id(tiny_engine, d) for d in "0123456789")
    assert np.array_equal(np.array(out[0])[finite], np.array(logits[0])[finite])


def test_mask_forbids_logit_rows_beyond_the_tokenizer(tiny_engine, cache) -> None:
    import mlx.core as mx

    proc = cache.processor(Constraint("json_object"))
    vocab = tiny_engine.info.vocab_size
    out = np.array(proc(mx.array([5]), mx.zeros((1, vocab + 40)))[0])
    assert out.shape == (vocab + 40,)
    assert np.isneginf(out[vocab:]).all()
    assert np.isfinite(out[token_id(tiny_engine, "{")])


def test_processor_follows_the_sampled_tokens(tiny_engine, cache) -> None:
    import mlx.core as mx

    proc = cache.processor(Constraint("choice", '["ab", "cd"]'))
    a, b, c = (token_id(tiny_engine, ch) for ch in "abc")
    logits = mx.zeros((1, tiny_engine.info.vocab_size))

    def allowed(tokens: list[int]) -> list[int]:
        out = np.array(proc(mx.array(tokens), logits)[0])
        return np.nonzero(np.isfinite(out))[0].tolist()

    assert allowed([7, 8]) == sorted([a, c])
    assert not proc.done
    assert allowed([7, 8, a]) == [b]
    assert (proc.accepted, proc.done) == (1, False)
    assert allowed([7, 8, a, b]) == [2]  # only EOS
    assert (proc.accepted, proc.done) == (2, True)
    proc.advance(1, b)  # the Row reporting a token already accepted is a no-op
    assert proc.accepted == 2


def test_rejected_token_stops_masking(tiny_engine, cache) -> None:
    import mlx.core as mx

    proc = cache.processor(CHOICE)
    proc.advance(0, token_id(tiny_engine, "z"))
    assert proc.broken and not proc.done
    logits = mx.zeros((1, tiny_engine.info.vocab_size))
    assert np.isfinite(np.array(proc(mx.array([1, 2]), logits))).all()


# ------------------------------------------------------- both lanes, end to end
@pytest.mark.parametrize("constraint", [JSON_SCHEMA, REGEX, CHOICE], ids=lambda c: c.kind)
@pytest.mark.parametrize("lane", ["batched", "serial"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_output_matches_the_grammar(
    tiny_engine, serial_engine, constraint, lane, temperature
) -> None:
    engine = tiny_engine if lane == "batched" else serial_engine
    prompt = tuple(engine.text_prompt("hello"))
    # logprobs=True: every token then arrives in a Delta (text may be held back).
    request = GenerationRequest(
        prompt,
        max_tokens=80,
        sampling=SamplingParams(temperature=temperature),
        constraint=constraint,
        logprobs=True,
    )
    text, ids, _, fin = run(engine, request)
    check_output(constraint, text)
    assert replay(engine, constraint, ids)
    # Ends on the grammar's last token: no EOS is generated or counted.
    assert (fin.finish_reason, fin.lane, fin.completion_tokens) == ("stop", lane, len(ids))
    assert 2 not in ids


def test_unconstrained_output_does_not_match(tiny_engine) -> None:
    """The mask is what makes the outputs above valid."""
    prompt = tuple(tiny_engine.text_prompt("hello"))
    text, _, _, _ = run(tiny_engine, GenerationRequest(prompt, max_tokens=12))
    assert not re.fullmatch(REGEX.spec, text) and text not in ("yes", "no", "maybe")
    with pytest.raises(ValueError):
        json.loads(text)


def test_concurrent_rows_keep_their_own_grammars(tiny_engine) -> None:
    prompts = ["hello", "the world", "or", "he said", "abc", "tell me"]
    constraints = [JSON_SCHEMA, REGEX, CHOICE, None] * 2

    async def all_rows():
        return await asyncio.gather(
            *(
                generate(
                    tiny_engine,
                    GenerationRequest(
                        tuple(tiny_engine.text_prompt(p)),
                        max_tokens=80,
                        sampling=SamplingParams(temperature=1.0),
                        constraint=c,
                        logprobs=True,
                    ),
                )
                for p, c in zip(prompts, constraints, strict=False)
            )
        )

    results = asyncio.run(all_rows())
    for constraint, (text, ids, _, fin) in zip(constraints, results, strict=False):
        assert fin.lane == "batched"
        if constraint is not None:
            check_output(constraint, text)
            assert replay(tiny_engine, constraint, ids)
            assert fin.finish_reason == "stop"


@pytest.mark.parametrize("lane", ["batched", "serial"])
def test_mask_applies_after_logit_bias(tiny_engine, serial_engine, lane) -> None:
    engine = tiny_engine if lane == "batched" else serial_engine
    n, x = token_id(engine, "n"), token_id(engine, "x")
    # +100 on "x" (forbidden) cannot break the grammar; +100 on "n" picks "no".
    bias = LogitsParams(logit_bias=((x, 100.0), (n, 100.0)))
    request = GenerationRequest(
        tuple(engine.text_prompt("hello")), max_tokens=8, logits=bias, constraint=CHOICE
    )
    text, _, _, fin = run(engine, request)
    assert (text, fin.finish_reason) == ("no", "stop")


@pytest.mark.parametrize("lane", ["batched", "serial"])
def test_logprobs_describe_the_masked_distribution(tiny_engine, serial_engine, lane) -> None:
    engine = tiny_engine if lane == "batched" else serial_engine
    request = GenerationRequest(
        tuple(engine.text_prompt("hello")),
        max_tokens=8,
        constraint=CHOICE,
        logprobs=True,
        top_logprobs=4,
    )
    text, ids, lps, _ = run(engine, request)
    assert [lp.id for lp in lps] == ids
    first = lps[0].top
    # Only "y", "n" and "m" may start a choice; they share all the probability.
    allowed = {token_id(engine, ch) for ch in "ynm"}
    assert {t.id for t in first[:3]} == allowed
    assert math.isclose(sum(math.exp(t.logprob) for t in first[:3]), 1.0, rel_tol=1e-3)
    assert first[3].logprob == LOGPROB_FLOOR
    # After the first letter the rest of the word is forced: probability 1.
    assert all(math.isclose(lp.logprob, 0.0, abs_tol=1e-4) for lp in lps[1:]), text


def test_constraint_that_does_not_compile_runs_unconstrained(tiny_engine) -> None:
    """Handlers drop such constraints before submitting; if one reaches the
    engine anyway it must not fail the request."""
    request = GenerationRequest(
        tuple(tiny_engine.text_prompt("hello")),
        max_tokens=4,
        constraint=Constraint("ebnf", "root ::= foo"),
    )
    _, ids, _, fin = run(tiny_engine, request)
    assert (fin.finish_reason, fin.completion_tokens) == ("length", 4)
    assert len(ids) == 4


def test_engine_grammar_problem(tiny_engine) -> None:
    assert tiny_engine.grammar_problem(REGEX) is None
    assert tiny_engine.grammar_problem(Constraint("regex", "(")) == (
        "Regex parsing error at position 2: The parenthesis is not closed."
    )

"""Token fast-forwarding (``--fill strict``, ``engine/speculative/fill.py``) through
the engine on the tiny random model: greedy requests with a grammar give token
for token, logprob for logprob the output of a server without fill, alone and
eight at once beside plain rows, where the model's tokenization of a forced
span is not the tokenizer's, with stop strings and budgets inside a span, and
together with n-gram drafts, a draft model and quantised KV; ``usage.fill``
adds up to the reply's tokens and ``/stats`` counts what the replies did."""

from __future__ import annotations

import asyncio
import json

import pytest

from mlxspec.engine import (
    Constraint,
    Delta,
    Engine,
    Finished,
    GenerationRequest,
    KvOptions,
    SamplingParams,
    SpeculationOptions,
)
from mlxspec.engine.speculative.fill import FIXED_COST

#: Fixed keys ("hello" and "the" meet the tiny tokenizer's merges), an enum, a
#: boolean: long forced spans between short free ones.
WEATHER = {
    "type": "object",
    "properties": {
        "weather_report_location": {"type": "string", "maxLength": 6},
        "temperature_unit": {"enum": ["celsius", "fahrenheit"]},
        "hello_world_flag": {"type": "boolean"},
    },
    "required": ["weather_report_location", "temperature_unit", "hello_world_flag"],
    "additionalProperties": False,
}
#: A forced tool call's shape: the name is a constant, the argument keys fixed.
TOOL_CALL = {
    "type": "object",
    "properties": {
        "name": {"const": "get_current_weather"},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 5},
                "order": {"type": "boolean"},
            },
            "required": ["city", "order"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}
SCHEMAS = [WEATHER, TOOL_CALL]
PROMPTS = ["give me json", "the weather in oslo", "hello there", "call a tool", "x y z"]


def _engine(folder, batch: int, fill: bool, **kw) -> Engine:
    engine = Engine.load(folder, "tiny-llama", max_batch=batch, fill=fill, **kw)
    engine.start()
    return engine


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    engine = _engine(tiny_model_dir, 1, False)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def fill8(tiny_model_dir):
    """Eight rows, costed as on a GPU: a span is fed even where the other rows
    pad to its length (on the CPU's cost a lone span among several rows waits,
    ``test_the_cpu_cost_rule_keeps_output_and_skips_lone_spans``)."""
    engine = _engine(tiny_model_dir, 8, True)
    engine.speculator.fill_cost = FIXED_COST["gpu"]
    yield engine
    engine.close()


def _constraint(schema: dict) -> Constraint:
    return Constraint("json_schema", json.dumps(schema), any_whitespace=False)


def _requests(engine: Engine, n: int = 8, **kw) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            tuple(engine.text_prompt(PROMPTS[i % len(PROMPTS)])),
            max_tokens=110 + 7 * i,
            constraint=_constraint(SCHEMAS[i % 2]),
            **kw,
        )
        for i in range(n)
    ]


async def _events(engine: Engine, request: GenerationRequest) -> tuple[list[Delta], Finished]:
    deltas, finished = [], None
    async for event in engine.submit(request):
        if isinstance(event, Delta):
            deltas.append(event)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return deltas, finished


def _gather(engine: Engine, requests: list[GenerationRequest]):
    async def go():
        return await asyncio.gather(*(_events(engine, r) for r in requests))

    return asyncio.run(asyncio.wait_for(go(), 180))


def _tokens(deltas: list[Delta]) -> list[int]:
    return [t for d in deltas for t in d.token_ids]


def _text(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


def _same(got, want) -> None:
    """Token ids, text, finish reason and counts equal."""
    (gd, gf), (wd, wf) = got, want
    assert _text(gd) == _text(wd)
    assert _tokens(gd) == _tokens(wd)
    assert (gf.finish_reason, gf.completion_tokens) == (wf.finish_reason, wf.completion_tokens)


def _consistent(finished: Finished) -> None:
    """``usage.fill`` adds up: emitted span tokens plus sampled ones are the reply."""
    fill = finished.fill
    assert fill is not None
    assert fill.injected + fill.decode_steps == finished.completion_tokens
    assert sum(fill.span_lens) == fill.injected and len(fill.span_lens) == fill.events
    assert fill.injected <= fill.verify_accepted
    assert fill.events <= fill.verify_events


def test_lone_greedy_requests_equal_unfilled_output(plain, fill8) -> None:
    reqs = _requests(plain, 4, logprobs=True, top_logprobs=2)
    for req in reqs:
        got, want = _gather(fill8, [req])[0], _gather(plain, [req])[0]
        _same(got, want)
        values = [e.logprob for d in got[0] for e in d.logprobs]
        assert values == pytest.approx([e.logprob for d in want[0] for e in d.logprobs], abs=1e-4)
        _consistent(got[1])
        assert got[1].fill.injected >= 20  # the keys, the tool's name, the enum's rest
        assert want[1].fill is None


def test_eight_rows_mixed_with_plain_rows_equal_unfilled_output(plain, fill8) -> None:
    """Four grammar rows fill while four rows without a grammar decode beside them."""
    grammar = _requests(plain, 4)
    free = [GenerationRequest(tuple(plain.text_prompt(p)), max_tokens=20) for p in PROMPTS[:4]]
    before = fill8.stats_snapshot().fill
    mixed = [r for pair in zip(grammar, free, strict=True) for r in pair]
    together = _gather(fill8, mixed)
    for req, got in zip(mixed, together, strict=True):
        _same(got, _gather(plain, [req])[0])
        assert got[1].lane == "batched"
        if req.constraint is None:
            assert got[1].fill is None
        else:
            _consistent(got[1])
    after = fill8.stats_snapshot().fill
    fills = [f.fill for _, f in together if f.fill is not None]
    assert after["injected"] - before["injected"] >= sum(f.injected for f in fills) > 0
    assert after["spans"] - before["spans"] == sum(f.verify_events for f in fills)


def test_spans_the_model_tokenizes_otherwise_still_equal(plain, fill8) -> None:
    """The model does not write the forced text the way the tokenizer encodes
    it (byte tokens where a merge exists, a token reaching past the span):
    those span tokens are rejected and the model's own emitted instead."""
    req = _requests(plain, 1)[0]  # WEATHER: "hello" and "the" have merges
    got, want = _gather(fill8, [req])[0], _gather(plain, [req])[0]
    _same(got, want)
    assert got[1].fill.verify_rejected > 0
    canonical = list(plain.tokenizer.encode(_text(want[0]), add_special_tokens=False))
    assert canonical != _tokens(want[0])  # asserting the encoding would change the output


def test_stop_strings_and_budgets_inside_a_span(plain, fill8) -> None:
    reqs = [
        GenerationRequest(r.prompt, max_tokens=r.max_tokens, constraint=r.constraint, stop=(s,))
        for r, s in zip(_requests(plain, 2), ["temperature", "arguments"], strict=True)
    ]
    reqs += [
        GenerationRequest(r.prompt, max_tokens=n, constraint=r.constraint)
        for r, n in zip(_requests(plain, 2), [5, 9], strict=True)
    ]
    together = _gather(fill8, reqs)
    for req, got in zip(reqs, together, strict=True):
        _same(got, _gather(plain, [req])[0])
        _consistent(got[1])
    assert [f.finish_reason for _, f in together] == ["stop", "stop", "length", "length"]
    assert together[2][1].completion_tokens == 5 and together[2][1].fill.truncated >= 1


def test_sampled_rows_fill_and_stay_inside_the_grammar(fill8) -> None:
    hot = SamplingParams(temperature=1.0)
    reqs = [
        GenerationRequest(r.prompt, max_tokens=120, constraint=r.constraint, sampling=hot)
        for r in _requests(fill8, 4)
    ]
    for deltas, finished in _gather(fill8, reqs):
        _consistent(finished)
        assert finished.fill.injected > 0
        if finished.finish_reason == "stop":
            assert isinstance(json.loads(_text(deltas)), dict)


def test_requests_that_cannot_fill_omit_it(fill8) -> None:
    seeded = SamplingParams(temperature=1.0, seed=3)
    req = _requests(fill8, 1)[0]
    for other in (
        GenerationRequest(req.prompt, max_tokens=8),  # no grammar
        GenerationRequest(req.prompt, max_tokens=8, constraint=req.constraint, sampling=seeded),
    ):
        assert _gather(fill8, [other])[0][1].fill is None


@pytest.fixture(scope="module")
def model64(tmp_path_factory):
    """The tiny model with 64-wide heads (KV groups of 32 and 64 fit)."""
    from fixtures.tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("fill") / "tiny64", head_dim=64, context=1024)


@pytest.mark.parametrize("kv", ["bf16", "kv8"])
def test_fill_composes_with_drafts_and_quantised_kv(model64, kv) -> None:
    """Fill rows beside n-gram rows, and beside sampled draft-model rows
    (whose drafts come with probabilities), on full and 8-bit KV: every greedy
    row equals the server without fill or drafts on the same KV."""
    options = None if kv == "bf16" else KvOptions(kv)
    base = _engine(model64, 1, False, kv=options)
    ngram = _engine(model64, 8, True, kv=options, speculation=SpeculationOptions("ngram", 4))
    drafts = SpeculationOptions("model", 3, str(model64))  # its own draft: the same weights
    model = _engine(model64, 8, True, kv=options, speculation=drafts)
    for engine in (ngram, model):
        engine.speculator.fill_cost = FIXED_COST["gpu"]  # spans beside the drafts
    try:
        grammar = _requests(base, 3)
        repeat = "one two three one two three one two three one"
        free = GenerationRequest(tuple(base.text_prompt(repeat)), max_tokens=20)
        hot = GenerationRequest(free.prompt, max_tokens=20, sampling=SamplingParams(1.0))
        want = [_gather(base, [req])[0] for req in [*grammar, free]]
        for engine in (ngram, model):
            together = _gather(engine, [*grammar, free, hot])
            for got, expected in zip(together[:4], want, strict=True):
                _same(got, expected)
            assert all(f.fill is not None and f.fill.injected > 0 for _, f in together[:3])
            assert together[3][1].speculation is not None and together[3][1].fill is None
    finally:
        for engine in (base, ngram, model):
            engine.close()


def test_the_cpu_cost_rule_keeps_output_and_skips_lone_spans(plain, tiny_model_dir) -> None:
    """Costed as on the CPU, a grammar row beside seven plain rows mostly
    waits (a span would pad all eight rows) and still answers as without fill;
    alone it fills."""
    engine = _engine(tiny_model_dir, 8, True)
    engine.speculator.fill_cost = FIXED_COST["cpu"]
    try:
        grammar = _requests(plain, 1)[0]
        free = [GenerationRequest(tuple(plain.text_prompt(p)), max_tokens=60) for p in PROMPTS]
        rows = [grammar, *free, *free[:2]]
        together = _gather(engine, rows)
        for req, got in zip(rows, together, strict=True):
            _same(got, _gather(plain, [req])[0])
        alone = _gather(engine, [grammar])[0][1].fill
        _consistent(together[0][1])
        assert together[0][1].fill.injected < alone.injected
    finally:
        engine.close()

"""Speculative decoding through the engine (``--draft-kind ngram`` on the tiny
random model): concurrent and lone greedy requests give the text of a server
without drafts, token counts, finish reasons, stop strings, logprobs and an
EOS inside an accepted run included; ``usage.speculation`` adds up; seeded
requests do not speculate and still reproduce; a sampled request speculates
within its budget; a cancelled speculating request leaves the others running;
``lane`` is ``batched`` with ``--batch N`` and ``serial+spec`` with ``--batch 1``."""

from __future__ import annotations

import asyncio

import pytest

from mlxspec.engine import (
    Delta,
    Engine,
    Finished,
    GenerationRequest,
    SamplingParams,
    SpeculationOptions,
)
from tests.api.test_speculative_batch import PROMPTS  # repetitive: lookup finds drafts
from tests.helpers import text_and_finish


def _engine(folder, batch: int, spec: bool) -> Engine:
    options = SpeculationOptions("ngram", 4) if spec else None
    engine = Engine.load(folder, "tiny-llama", max_batch=batch, speculation=options)
    engine.start()
    return engine


@pytest.fixture(scope="module")
def plain(tiny_model_dir):
    engine = _engine(tiny_model_dir, 1, False)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def spec8(tiny_model_dir):
    engine = _engine(tiny_model_dir, 8, True)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def spec1(tiny_model_dir):
    engine = _engine(tiny_model_dir, 1, True)
    yield engine
    engine.close()


async def _events(engine: Engine, request: GenerationRequest) -> tuple[list[Delta], Finished]:
    deltas, finished = [], None
    async for event in engine.submit(request):
        if isinstance(event, Delta):
            deltas.append(event)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return deltas, finished


def _gather(
    engine: Engine, requests: list[GenerationRequest]
) -> list[tuple[list[Delta], Finished]]:
    async def go():
        return await asyncio.gather(*(_events(engine, r) for r in requests))

    return asyncio.run(asyncio.wait_for(go(), 120))


def _logprobs(deltas: list[Delta]) -> list[float]:
    """Every token's logprob then its candidates', in order."""
    return [x for d in deltas for e in d.logprobs for x in (e.logprob, *(t.logprob for t in e.top))]


def _text(deltas: list[Delta]) -> str:
    return "".join(d.text for d in deltas)


def _requests(engine: Engine, **kw) -> list[GenerationRequest]:
    return [
        GenerationRequest(tuple(engine.text_prompt(t)), max_tokens=12 + 3 * i, **kw)
        for i, t in enumerate(PROMPTS)
    ]


def test_eight_concurrent_greedy_requests_equal_no_drafts(plain, spec8) -> None:
    reqs = _requests(plain, logprobs=True, top_logprobs=3)
    fast = _gather(spec8, reqs)
    slow = [_gather(plain, [r])[0] for r in reqs]
    for (fd, ff), (sd, sf) in zip(fast, slow, strict=True):
        assert _text(fd) == _text(sd)
        assert (ff.finish_reason, ff.completion_tokens) == (sf.finish_reason, sf.completion_tokens)
        assert _logprobs(fd) == pytest.approx(_logprobs(sd), abs=1e-4)
        assert [e.id for d in fd for e in d.logprobs] == [e.id for d in sd for e in d.logprobs]
        assert [[t.id for t in e.top] for d in fd for e in d.logprobs] == [
            [t.id for t in e.top] for d in sd for e in d.logprobs
        ]
        assert ff.lane == "batched" and sf.speculation is None
        spec = ff.speculation
        assert spec is not None and spec.accepted <= spec.drafted
        if ff.finish_reason == "length":  # each target call gave one token plus its kept drafts
            assert spec.target_calls + spec.accepted == ff.completion_tokens
    assert sum(f.speculation.accepted for _, f in fast) > 0
    stats = spec8.stats_snapshot().speculation
    assert stats["accepted"] >= sum(f.speculation.accepted for _, f in fast)


def test_stop_strings_inside_accepted_runs(plain, spec8) -> None:
    """Stop strings end the output where they end it without drafts, even when
    the stop lands inside a run of kept drafts."""
    reqs = [
        GenerationRequest(r.prompt, max_tokens=30, stop=(stop,))
        for r, stop in zip(_requests(plain), ["four one", " mat", "e f", "lo h"], strict=False)
    ]
    fast = _gather(spec8, reqs)
    slow = [_gather(plain, [r])[0] for r in reqs]
    assert [(_text(d), f.finish_reason, f.completion_tokens) for d, f in fast] == [
        (_text(d), f.finish_reason, f.completion_tokens) for d, f in slow
    ]


def test_lone_request_with_batch_1_reports_serial_spec(plain, spec1) -> None:
    req = _requests(plain)[0]
    (fd, ff), (sd, sf) = _gather(spec1, [req])[0], _gather(plain, [req])[0]
    assert _text(fd) == _text(sd)
    assert ff.speculation is not None and ff.speculation.accepted > 0
    assert (ff.lane, sf.lane) == ("serial+spec", "serial")


def test_seeded_requests_do_not_speculate_and_reproduce(plain, spec8) -> None:
    hot = SamplingParams(temperature=5.0, seed=11)
    req = GenerationRequest(tuple(plain.text_prompt(PROMPTS[1])), max_tokens=10, sampling=hot)
    together = _gather(spec8, [req, *_requests(plain)[:3]])
    alone = _gather(plain, [req])[0]
    assert _text(together[0][0]) == _text(alone[0])
    assert together[0][1].speculation is None
    assert all(f.speculation is not None for _, f in together[1:])


def test_sampled_requests_speculate_within_their_budget(spec8) -> None:
    warm = SamplingParams(temperature=0.7, top_p=0.9)
    reqs = _requests(spec8, sampling=warm)
    for deltas, finished in _gather(spec8, reqs):
        assert finished.completion_tokens <= 12 + 3 * 7
        assert finished.speculation is not None
        assert sum(len(d.token_ids) for d in deltas) == finished.completion_tokens


def test_a_cancelled_speculating_request_leaves_the_others_running(plain, spec8) -> None:
    reqs = _requests(plain)

    async def go():
        long = spec8.submit(GenerationRequest(reqs[0].prompt, max_tokens=200))
        others = asyncio.gather(*(text_and_finish(spec8, r) for r in reqs[1:4]))
        async for event in long:
            if isinstance(event, Delta):
                long.cancel()
        return await others

    before = spec8.counters["cancelled"]
    results = asyncio.run(asyncio.wait_for(go(), 60))
    want = [_gather(plain, [r])[0] for r in reqs[1:4]]
    assert [t for t, _ in results] == [_text(d) for d, _ in want]
    assert spec8.counters["cancelled"] == before + 1


@pytest.fixture(scope="module")
def eos_model(tiny_model_dir, tmp_path_factory):
    """A tiny model that does not echo its input (unscaled random weights),
    whose ``eos_token_id`` is a token its greedy answer to one of ``PROMPTS`` first
    gives a few tokens in: an EOS that lands inside a run of kept drafts.
    Returns ``(folder, text, index of the EOS)``."""
    import json
    import shutil

    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm import load
    from mlx_lm.generate import generate_step
    from mlx_lm.models.llama import Model, ModelArgs

    folder = tmp_path_factory.mktemp("eos") / "model"
    shutil.copytree(tiny_model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    for seed in (7, 8, 9, 10):  # random tiny models settle on one token fast: find a change
        mx.random.seed(seed)
        model = Model(ModelArgs.from_dict(config))
        weights = dict(tree_flatten(model.parameters()))
        mx.save_safetensors(str(folder / "model.safetensors"), weights)
        model, tokenizer = load(str(folder))[:2]
        for text in PROMPTS:
            prompt = mx.array(tokenizer.encode(text), dtype=mx.uint32)
            tokens = [t for t, _ in generate_step(prompt, model, max_tokens=24)]
            news = [j for j in range(2, len(tokens)) if tokens[j] not in tokens[:j]]
            if news:
                at = news[0]
                config["eos_token_id"] = [2, tokens[at]]
                (folder / "config.json").write_text(json.dumps(config))
                return folder, text, at
    raise AssertionError("no tiny model changed its token")


def test_eos_inside_an_accepted_run_ends_the_answer_there(eos_model) -> None:
    folder, text, at = eos_model
    plain_engine = Engine.load(folder, "eos", max_batch=1)
    k = 4 if (at + 1) % 5 else 5  # runs of k + 1 tokens: the EOS falls inside one
    drafted = SpeculationOptions("model", k, str(folder))  # drafts for itself: all pass
    fast_engine = Engine.load(folder, "eos", max_batch=8, speculation=drafted)
    plain_engine.start()
    fast_engine.start()
    try:
        prompt = tuple(plain_engine.tokenizer.encode(text))
        req = GenerationRequest(prompt, max_tokens=24, logprobs=True)
        (fd, ff), (sd, sf) = _gather(fast_engine, [req])[0], _gather(plain_engine, [req])[0]
        ended = dict(fast_engine.counters)
    finally:
        plain_engine.close()
        fast_engine.close()
    assert (sf.finish_reason, sf.completion_tokens) == ("stop", at + 1)  # EOS counted
    assert (ff.finish_reason, ff.completion_tokens) == ("stop", at + 1)
    assert _text(fd) == _text(sd)
    assert [e.id for d in fd for e in d.logprobs] == [e.id for d in sd for e in d.logprobs]
    assert ff.speculation is not None
    assert ff.speculation.target_calls == -(-(at + 1) // (k + 1))
    assert ff.speculation.accepted == ff.speculation.drafted  # the draft is the model itself
    assert ended["completed"] == 1  # the run's tokens after the EOS never reached the row

"""Speculative decoding on the embedded SmolLM2-135M: with prompt-lookup drafts
and with a real draft model (the same model re-quantised to 3 bits, which
agrees with it often, not always), greedy answers are token for token the
answers without drafts, for one request alone and for two at once.

Two prompts (81 and 52 tokens), chosen so that with either draft kind both rows
of the batch draft and drafts are accepted and rejected, so one verify step keeps
different numbers of tokens per row. Measured, drafted/accepted per row: ngram
8/4 and 4/0, model 17/7 and 15/7 (greedy answers of 15 and 13 tokens). Each
token costs 0.1 to 0.2 s of CPU here (the 4-bit weights run MLX's quantised CPU
kernel), so every prompt token counts: eight prompts (390 tokens) cost ~460 s of
CPU, these two (133 tokens) ~120 s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.draft_model import build_low_bit_draft
from mlxspec.engine import Delta, Engine, Finished, GenerationRequest, SpeculationOptions

CODE = """def total(items):
    result = 0
    for item in items:
        result = result + item.price * item.count
    return result
"""
TASKS = [
    f"Rename the function total to order_total in this code and show the whole code:\n{CODE}",
    "Summarise: The river rose in the night. The river flooded the mill. The mill was rebuilt.",
]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from mlxspec.engine.model.loader import resolve_model

    return resolve_model(None).path


@pytest.fixture(scope="module")
def draft_dir(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_low_bit_draft(model_dir, tmp_path_factory.mktemp("draft") / "smollm2-q3", bits=3)


def _engine(folder: Path, batch: int, options: SpeculationOptions | None) -> Engine:
    engine = Engine.load(folder, "smollm2", max_batch=batch, speculation=options)
    engine.start()
    return engine


@pytest.fixture(scope="module")
def plain(model_dir: Path) -> Iterator[Engine]:
    engine = _engine(model_dir, 1, None)
    yield engine
    engine.close()


def _prompts(engine: Engine) -> list[tuple[int, ...]]:
    return [
        tuple(
            engine.tokenizer.apply_chat_template(
                [{"role": "user", "content": t}], add_generation_prompt=True
            )
        )
        for t in TASKS
    ]


def _run(engine: Engine, prompts: list[tuple[int, ...]]) -> list[tuple[list[int], Finished]]:
    async def one(prompt: tuple[int, ...]):
        ids, finished = [], None
        async for event in engine.submit(GenerationRequest(prompt, max_tokens=MAX_TOKENS)):
            if isinstance(event, Delta):
                ids.extend(event.token_ids)
            elif isinstance(event, Finished):
                finished = event
        return ids, finished

    async def go():
        return await asyncio.gather(*(one(p) for p in prompts))

    return asyncio.run(asyncio.wait_for(go(), 600))


@pytest.fixture(scope="module")
def expected(plain: Engine) -> list[tuple[list[int], Finished]]:
    return [_run(plain, [p])[0] for p in _prompts(plain)]


@pytest.mark.parametrize("kind", ["ngram", "model"])
def test_greedy_answers_with_drafts_equal_the_plain_ones(
    kind: str, model_dir: Path, draft_dir: Path, expected
) -> None:
    options = SpeculationOptions(kind, 4, str(draft_dir) if kind == "model" else None)
    engine = _engine(model_dir, len(TASKS), options)
    try:
        prompts = _prompts(engine)
        alone = _run(engine, prompts[:1])
        together = _run(engine, prompts)
    finally:
        engine.close()
    assert alone[0][0] == expected[0][0]
    for (ids, finished), (want, plain_finished) in zip(together, expected, strict=True):
        assert ids == want
        assert finished.completion_tokens == plain_finished.completion_tokens
        assert finished.speculation is not None
    accepted = sum(f.speculation.accepted for _, f in together)
    drafted = sum(f.speculation.drafted for _, f in together)
    assert 0 < accepted < drafted  # drafts helped, and some were rejected
    assert all(f.speculation.drafted > 0 for _, f in together)  # every row of the batch drafted

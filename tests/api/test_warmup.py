"""Start-up warm-up (:mod:`mlxspec.engine.model.warmup`): which prefill lengths it runs,
that requests arriving meanwhile wait and complete, that outputs are the same
with and without it, and how ``MLXSPEC_WARMUP`` switches it."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from mlxspec.cli.flags import parse_config
from mlxspec.conformance.httpx_checks import checking_async_client, checking_client
from mlxspec.conformance.live import serve
from mlxspec.engine import Delta, Engine, Finished, GenerationRequest, LogitsParams, RequestHandle
from mlxspec.engine.caches.kv import bucket_tail, tail_buckets
from mlxspec.engine.caches.prompt_cache import PromptCache
from mlxspec.engine.model.warmup import warmup_lengths
from mlxspec.http.app import create_app

NO_EOS = LogitsParams(logit_bias=((2, -1e9),))
#: The tiny model's window is 256 tokens: buckets of 256 and up (and the 512-token
#: prefill chunk) cannot be a prefill there.
TINY_LENGTHS = (1, 2, 4, 8, 16, 32, 64, 128, 192)
#: What the tiny engine's warm-up feeds the model: each length once, then a decode step.
TINY_WARMUP_SHAPES = [(1, n) for n in TINY_LENGTHS] + [(1, 1)]


def warmup_shapes(max_batch: int) -> list[tuple[int, int]]:
    """The warm-up's passes for ``--batch max_batch``: :data:`TINY_WARMUP_SHAPES`,
    then (batched lane only) a 16-token row and one decode step per row count 2..max."""
    if max_batch < 2:
        return TINY_WARMUP_SHAPES
    return TINY_WARMUP_SHAPES + [(1, 16)] + [(b, 1) for b in range(2, max_batch + 1)]


class RecordingModel:
    """The tiny model, recording each forward pass's input shape; with a gate, the
    first pass waits until the gate opens (so a test can act mid-warm-up)."""

    def __init__(
        self, model: Any, gate: threading.Event | None = None, fail_first: bool = False
    ) -> None:
        self._model = model
        self.gate = gate
        self.fail_first = fail_first
        self.shapes: list[tuple[int, ...]] = []
        self.entered = threading.Event()

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        self.shapes.append(tuple(inputs.shape))
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(60), "the test never opened the gate"
        if self.fail_first and len(self.shapes) == 1:
            raise RuntimeError("out of memory")
        return self._model(inputs, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)


def _engine(tiny_engine: Engine, model: Any, max_batch: int, **kw: Any) -> Engine:
    """An engine on the tiny model whose prompt cache buckets tails as on a GPU."""
    kw.setdefault("prompt_cache", PromptCache(1 << 30, bucket_tails=True))
    return Engine(
        model,
        tiny_engine.tokenizer,
        tiny_engine.info,
        tiny_engine.defaults,
        max_batch=max_batch,
        **kw,
    )


async def _collect(engine: Engine, request: GenerationRequest) -> tuple[str, list[int], Finished]:
    return await _gather(engine.submit(request))


async def _gather(handle: RequestHandle) -> tuple[str, list[int], Finished]:
    text, ids, finished = "", [], None
    async for event in handle:
        if isinstance(event, Delta):
            text, ids = text + event.text, ids + list(event.token_ids)
        elif isinstance(event, Finished):
            finished = event
    assert finished is not None
    return text, ids, finished


def _prompts(engine: Engine) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two prompts, the second the first plus 12 tokens."""
    first = tuple(engine.text_prompt("the quick brown fox jumps over the lazy dog " * 3))
    return first, first + tuple(engine.text_prompt(" and then it ran far away"))[:12]


def _turns(engine: Engine) -> list[tuple[str, list[int], str, int]]:
    """Two greedy turns on :func:`_prompts` (the second a prompt-cache hit whose
    11-token tail is bucketed to 16): text, ids, finish_reason, cached tokens."""
    out = []
    for prompt in _prompts(engine):
        request = GenerationRequest(prompt, max_tokens=10, logits=NO_EOS)
        text, ids, fin = asyncio.run(_collect(engine, request))
        out.append((text, ids, fin.finish_reason, fin.cached_tokens))
    return out


# ------------------------------------------------------------------ the lengths
def test_tail_buckets_are_every_length_bucket_tail_rounds_to() -> None:
    assert tail_buckets() == (1, 2, 4, 8, 16, 32, 64, 128, 192, 256, 320, 384, 448, 512)
    prefills = set()
    for prompt_tokens in range(2, 700):
        for usable in range(max(prompt_tokens - 1 - 512, 1), prompt_tokens - 1):
            kept = bucket_tail(usable, prompt_tokens)  # a tail of 1 to 512 tokens
            if kept > 0:  # 0: the bucket is longer than the prompt, a miss
                prefills.add(prompt_tokens - kept - 1)
    assert sorted(prefills) == list(tail_buckets())


def test_warmup_lengths_add_the_prefill_chunk_and_fit_the_window() -> None:
    assert warmup_lengths(32768, 512) == tail_buckets()
    assert warmup_lengths(32768, 2048) == (*tail_buckets(), 2048)
    with_100 = (1, 2, 4, 8, 16, 32, 64, 100, 128, 192, 256, 320, 384, 448, 512)
    assert warmup_lengths(32768, 100) == with_100
    assert warmup_lengths(256, 512) == TINY_LENGTHS  # a prefill is at most 255 tokens
    assert warmup_lengths(193, 8) == (1, 2, 4, 8, 16, 32, 64, 128, 192)
    assert warmup_lengths(192, 8) == (1, 2, 4, 8, 16, 32, 64, 128)


# ------------------------------------------------------------------ the engine
@pytest.mark.parametrize("max_batch", [1, 8])
def test_outputs_match_and_only_the_warmup_passes_differ(tiny_engine, max_batch, caplog) -> None:
    caplog.set_level(logging.INFO, "mlxspec.engine")
    cold_model, warm_model = RecordingModel(tiny_engine.model), RecordingModel(tiny_engine.model)
    cold = _engine(tiny_engine, cold_model, max_batch, warmup=False)
    warm = _engine(tiny_engine, warm_model, max_batch)  # default: on, since tails are bucketed
    assert (cold.warmup, warm.warmup) == (False, True)
    try:
        cold.start()
        cold_out = _turns(cold)
        warm.start()
        warm_out = _turns(warm)
    finally:
        cold.close()
        warm.close()
    assert warm_out == cold_out
    second = _prompts(cold)[1]
    assert [(t[2], t[3]) for t in cold_out] == [("length", 0), ("length", len(second) - 1 - 16)]
    shapes = warmup_shapes(max_batch)
    assert warm_model.shapes[: len(shapes)] == shapes
    assert warm_model.shapes[len(shapes) :] == cold_model.shapes
    (line,) = [r for r in caplog.records if r.message.startswith("warm-up")]
    assert line.levelno == logging.INFO
    assert re.fullmatch(
        r"warm-up: 9 prefill lengths \(1, 2, 4, 8, 16, 32, 64, 128, 192 tokens\) "
        rf"and decode steps of 1 to {max_batch} rows in \d+\.\d\d s",
        line.message,
    )


def test_a_failed_warmup_is_logged_and_the_engine_serves(tiny_engine, caplog) -> None:
    model = RecordingModel(tiny_engine.model, fail_first=True)
    engine = _engine(tiny_engine, model, 8)
    engine.start()
    try:
        text, ids, fin = asyncio.run(_collect(engine, GenerationRequest((5, 6, 7), max_tokens=2)))
    finally:
        engine.close()
    assert (len(ids), fin.finish_reason) == (2, "length")
    # the failed first warm-up pass, then only the request's (prefill of 2, 3 steps)
    assert model.shapes == [(1, 1), (1, 2), (1, 1), (1, 1), (1, 1)]
    assert [r.message for r in caplog.records if "warm-up" in r.message] == [
        "warm-up failed; serving without it"
    ]


def test_a_request_during_warmup_waits_then_completes(tiny_engine) -> None:
    reference = _engine(tiny_engine, tiny_engine.model, 8, warmup=False)
    gate = threading.Event()
    model = RecordingModel(tiny_engine.model, gate)
    engine = _engine(tiny_engine, model, 8, warmup=True)
    request = GenerationRequest(tuple(engine.text_prompt("hello there")), max_tokens=6)

    async def go() -> tuple[Any, httpx.Response, tuple[str, list[int], Finished]]:
        engine.start()
        assert await asyncio.to_thread(model.entered.wait, 60)  # first warm-up pass, held
        pending = asyncio.ensure_future(_gather(engine.submit(request)))
        transport = httpx.ASGITransport(app=create_app(engine, validate_responses=True))
        async with checking_async_client("http://localhost", transport=transport) as c:
            health = await c.get("/health")
        queued = (engine.in_flight, engine.counters["completed"], list(model.shapes))
        gate.set()
        return queued, health, await pending

    try:
        queued, health, (text, ids, fin) = asyncio.run(go())
        reference.start()
        want = asyncio.run(_collect(reference, request))
    finally:
        engine.close()
        reference.close()
    assert queued == (1, 0, [(1, 1)])
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert (text, ids, fin.completion_tokens) == want[:2] + (want[2].completion_tokens,)
    assert model.shapes[: len(warmup_shapes(8))] == warmup_shapes(8)
    assert engine.counters == {"completed": 1, "cancelled": 0, "failed": 0}


def test_no_warmup_pass_without_buckets_or_when_switched_off(tiny_engine) -> None:
    prompt = tuple(tiny_engine.text_prompt("hello there, how are you"))
    request = GenerationRequest(prompt, max_tokens=3, logits=NO_EOS)
    cases = {
        "cpu default": {"prompt_cache": PromptCache(1 << 30)},  # no buckets on the CPU
        "off": {"warmup": False},
        "cache off": {"prompt_cache": PromptCache(0, bucket_tails=True)},
    }
    for name, kw in cases.items():
        model = RecordingModel(tiny_engine.model)
        engine = _engine(tiny_engine, model, 8, **kw)
        assert engine.warmup is False, name
        engine.start()
        try:
            asyncio.run(_collect(engine, request))
        finally:
            engine.close()
        # generate_step: the prompt but its last token, then a pass per token
        # (the last prompt token's gives the first), one sampled ahead
        assert model.shapes == [(1, len(prompt) - 1)] + [(1, 1)] * 4, name


def test_engine_load_takes_the_switch(tiny_model_dir: Path) -> None:
    assert Engine.load(tiny_model_dir, "tiny-llama").warmup is False  # CPU: no buckets
    assert Engine.load(tiny_model_dir, "tiny-llama", warmup=True).warmup is True


# ------------------------------------------------------------------ the switch
@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), ("auto", None), ("0", False), ("1", True)]
)
def test_mlxspec_warmup_env(monkeypatch, value, expected) -> None:
    if value is None:
        monkeypatch.delenv("MLXSPEC_WARMUP", raising=False)
    else:
        monkeypatch.setenv("MLXSPEC_WARMUP", value)
    assert parse_config(["serve"]).warmup is expected


def test_mlxspec_warmup_env_rejects_other_values(monkeypatch, capsys) -> None:
    monkeypatch.setenv("MLXSPEC_WARMUP", "yes")
    with pytest.raises(SystemExit) as err:
        parse_config(["serve"])
    assert err.value.code == 2
    assert "MLXSPEC_WARMUP must be 0, 1 or auto" in capsys.readouterr().err


def test_serve_warms_up_under_mlxspec_warmup_1(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``MLXSPEC_WARMUP=1 mlxspec serve <tiny model>`` on this CPU warms before serving."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_WARMUP": "1"}
    argv = [sys.executable, "-m", "mlxspec", "serve", str(tiny_model_dir), "--port", "{port}"]
    log = tmp_path / "serve.log"
    with serve(argv, env, log, timeout=120) as base, checking_client(base, timeout=60) as c:
        r = c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200
    lines = [line for line in log.read_text().splitlines() if "warm-up" in line]
    assert len(lines) == 1
    assert lines[0].startswith(
        "INFO mlxspec.engine: warm-up: 9 prefill lengths (1, 2, 4, 8, 16, 32, 64, 128, 192 "
        "tokens) and decode steps of 1 to 8 rows in "
    )

"""Engine tests on the tiny random-weight Llama: generation, stops, limits,
cancellation and logprobs, compared with mlx-lm called directly."""

from __future__ import annotations

import asyncio

import pytest

from mlxspec.engine import (
    ContextLengthError,
    Delta,
    Finished,
    GenerationRequest,
    LogitsParams,
    PromptError,
    SamplingParams,
)


def run_request(engine, request: GenerationRequest) -> tuple[str, list, Finished]:
    async def go():
        handle = engine.submit(request)
        text, lps, fin = "", [], None
        async for ev in handle:
            if isinstance(ev, Delta):
                text += ev.text
                lps.extend(ev.logprobs)
            elif isinstance(ev, Finished):
                fin = ev
        return text, lps, fin

    return asyncio.run(go())


def mlx_lm_greedy(engine, prompt: list[int], n: int) -> list[int]:
    import mlx.core as mx
    from mlx_lm.generate import generate_step

    out = []
    for tok, _ in generate_step(mx.array(prompt), engine.model, max_tokens=n):
        out.append(tok)
        if tok in engine.tokenizer.eos_token_ids:
            break
    return out


def test_greedy_matches_mlx_lm(tiny_engine) -> None:
    prompt = tiny_engine.chat_prompt([{"role": "user", "content": "hello there"}])
    text, _, fin = run_request(tiny_engine, GenerationRequest(tuple(prompt), max_tokens=12))
    expected = mlx_lm_greedy(tiny_engine, prompt, 12)
    assert fin.completion_tokens == len(expected)
    eos = tiny_engine.tokenizer.eos_token_ids
    assert text == tiny_engine.tokenizer.decode([t for t in expected if t not in eos])
    assert fin.prompt_tokens == len(prompt)
    assert fin.finish_reason == ("stop" if expected[-1] in eos else "length")


def test_max_tokens_gives_length(tiny_engine) -> None:
    prompt = tiny_engine.text_prompt("hello")
    _, _, fin = run_request(tiny_engine, GenerationRequest(tuple(prompt), max_tokens=5))
    assert (fin.finish_reason, fin.completion_tokens) == ("length", 5)


def test_stop_string_cuts_output(tiny_engine) -> None:
    prompt = tuple(tiny_engine.text_prompt("hello"))
    full, _, _ = run_request(tiny_engine, GenerationRequest(prompt, max_tokens=10))
    assert len(full) >= 4
    stop = full[2:4]
    text, _, fin = run_request(tiny_engine, GenerationRequest(prompt, max_tokens=10, stop=(stop,)))
    assert text == full[: full.find(stop)]
    assert stop not in text
    assert fin.finish_reason == "stop"


def test_unset_max_tokens_stops_at_context_window(tiny_engine) -> None:
    prompt = tiny_engine.text_prompt("hello")
    window = tiny_engine.info.context_window
    # logit_bias forbids EOS so only the context window ends generation.
    bias = ((2, -1e9),)
    req = GenerationRequest(tuple(prompt), logits=LogitsParams(logit_bias=bias))
    _, _, fin = run_request(tiny_engine, req)
    assert fin.finish_reason == "length"
    assert fin.prompt_tokens + fin.completion_tokens == window


def test_prompt_longer_than_context_is_rejected(tiny_engine) -> None:
    window = tiny_engine.info.context_window
    with pytest.raises(ContextLengthError, match=str(window)):
        asyncio.run(_submit(tiny_engine, GenerationRequest(tuple([5] * window))))


async def _submit(engine, req):
    return engine.submit(req)


def test_logprobs_follow_mlx_lm_distribution(tiny_engine) -> None:
    import mlx.core as mx

    prompt = tiny_engine.text_prompt("hello")
    req = GenerationRequest(tuple(prompt), max_tokens=3, logprobs=True, top_logprobs=4)
    _, lps, _ = run_request(tiny_engine, req)
    assert len(lps) == 3
    logits = tiny_engine.model(mx.array(prompt)[None])[0, -1]
    ref = logits - mx.logsumexp(logits)
    first = lps[0]
    assert first.id == int(mx.argmax(ref).item())
    assert abs(first.logprob - ref[first.id].item()) < 1e-4
    values = [t.logprob for t in first.top]
    assert values == sorted(values, reverse=True) and len(values) == 4
    assert first.top[0].id == first.id  # greedy: sampled token is the top-1


def test_seeded_sampling_is_reproducible(tiny_engine) -> None:
    prompt = tuple(tiny_engine.text_prompt("hello"))
    req = GenerationRequest(prompt, max_tokens=8, sampling=SamplingParams(temperature=1.0, seed=7))
    assert run_request(tiny_engine, req)[0] == run_request(tiny_engine, req)[0]


def test_cancel_frees_the_engine(tiny_engine) -> None:
    prompt = tuple(tiny_engine.text_prompt("hello"))

    async def go():
        long = tiny_engine.submit(
            GenerationRequest(prompt, logits=LogitsParams(logit_bias=((2, -1e9),)))
        )
        async for ev in long:
            if isinstance(ev, Delta):
                long.cancel()
                break
        short = tiny_engine.submit(GenerationRequest(prompt, max_tokens=2))
        events = [ev async for ev in short]
        return events[-1]

    fin = asyncio.run(asyncio.wait_for(go(), 30))
    assert isinstance(fin, Finished) and fin.completion_tokens == 2


def test_media_parts_are_a_prompt_error(tiny_engine) -> None:
    msgs = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]
    with pytest.raises(PromptError, match="tiny-llama is text-only") as err:
        tiny_engine.chat_prompt(msgs)
    assert err.value.param == "messages[0].content[0]"


class CountingModel:
    """Forwards to a model and counts forward passes."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.model(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.model, name)


def test_cancel_during_prefill_abandons_the_request(tiny_engine) -> None:
    """A serial request cancelled before its first step runs no forward pass."""
    from mlxspec.engine import Engine, RequestHandle
    from mlxspec.engine.loop.solo import run_alone

    counting = CountingModel(tiny_engine.model)
    engine = Engine(
        counting, tiny_engine.tokenizer, tiny_engine.info, tiny_engine.defaults, max_batch=1
    )

    async def go():
        prompt = tuple(engine.text_prompt("hello ") * 40)
        handle = RequestHandle(GenerationRequest(prompt, max_tokens=5), asyncio.get_running_loop())
        handle.cancel()
        return run_alone(handle, engine.lane_parts, 5), [ev async for ev in handle]

    outcome, events = asyncio.run(go())
    assert outcome == "cancelled"
    assert [type(ev).__name__ for ev in events] == ["Cancelled"]
    assert counting.calls == 0


@pytest.mark.parametrize("temperature", [1e-39, 1e-320, 9e-6])
def test_a_vanishing_temperature_samples_greedily(temperature: float) -> None:
    """1 / temperature overflows float32 below ~3e-39 (NaN probabilities,
    random tokens); under 1e-5 the sampler is argmax, as for 0."""
    import mlx.core as mx

    from mlxspec.engine.sampling.sampler import build_sampler
    from mlxspec.engine.types import SamplingParams

    logits = mx.array([[0.0, 3.0, 1.0, 2.9] + [0.0] * 252])  # argmax: token 1
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    sampler = build_sampler(SamplingParams(temperature=temperature), [])
    assert {int(sampler(logprobs).item()) for _ in range(20)} == {1}


def test_prefill_chunks_are_128_tokens_on_the_cpu_and_512_on_a_gpu(tiny_engine, monkeypatch):
    import mlx.core as mx

    from mlxspec.engine.loop import lanes

    assert tiny_engine.lane_parts.prefill_step == 128  # this CPU
    assert lanes.default_prefill_step() == lanes.CPU_PREFILL_STEP == 128

    class Gpu:
        type = mx.gpu

    monkeypatch.setattr(mx, "default_device", lambda: Gpu())
    assert lanes.default_prefill_step() == lanes.PREFILL_STEP == 512

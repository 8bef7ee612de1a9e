"""KV cache quantisation on the embedded SmolLM2-135M: with the full-precision
greedy answer as the context, kv8 and kv4 caches pick the same next token at
most positions (teacher-forced greedy agreement, above the bounds measured on
this model), and the KV bytes per token fall by the layout's factor.

Measured (CPU, float32 and bf16 activations alike): teacher-forced over 4 chat
prompts x 12 answer tokens, kv8 picked the full-precision token at 0.979 of the
positions and kv4 at 0.875 (``MEASURED``). Free-running (8 prompts decoded at
once, 16 and 24 tokens): the share of tokens before each answer's first
divergence was 0.84 and 0.80 for kv8 (7 of 8 first tokens equal) and 0.20 and
0.16 for kv4 (4 of 8); mlx-lm's own ``generate_step`` with ``kv_bits=4`` (which
prefills the prompt unquantised) kept 0.30. A 135M model is sensitive to 4-bit
keys; the bounds sit under the measured figures and far above what a broken
cache gives.
"""

from __future__ import annotations

from pathlib import Path

from mlxspec.engine.caches.kv_scheme import KvOptions, resolve_scheme
from tests.real.test_speculation import TASKS

ANSWER_TOKENS = 12
#: Teacher-forced agreement measured on this model (4 prompts x 12 tokens);
#: the test's bounds are 0.9 and 0.75.
MEASURED = {"kv8": 0.979, "kv4": 0.875}


def _agreement(model, tokenizer, mode: str, cases: list[tuple[list[int], list[int]]]) -> float:
    import mlx.core as mx

    scheme = resolve_scheme(KvOptions(mode), model, None)
    same = total = 0
    for prompt, answer in cases:
        cache = scheme.make_cache(model)
        logits = model(mx.array([*prompt, *answer[:-1]], dtype=mx.uint32)[None], cache=cache)
        picks = mx.argmax(logits[0, len(prompt) - 1 :], axis=-1).tolist()
        same += sum(int(a == b) for a, b in zip(picks, answer, strict=True))
        total += len(answer)
    return same / total


def test_teacher_forced_greedy_agreement_with_full_precision() -> None:
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    from mlxspec.engine.model.cpu_weights import apply_cpu_weights
    from mlxspec.engine.model.loader import resolve_model

    folder: Path = resolve_model(None).path
    model, tokenizer = load(str(folder))
    apply_cpu_weights(model, "auto")  # float32 on the CPU, as the engine loads it
    cases = []
    for task in TASKS[1:8:2]:  # four short chat prompts
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": task}], add_generation_prompt=True
        )
        steps = generate_step(mx.array(prompt), model, max_tokens=ANSWER_TOKENS)
        cases.append((list(prompt), [int(t) for t, _ in steps]))
    assert _agreement(model, tokenizer, "bf16", cases) >= 0.95  # the answers are greedy
    kv8 = _agreement(model, tokenizer, "kv8", cases)
    kv4 = _agreement(model, tokenizer, "kv4", cases)
    print(f"teacher-forced agreement: kv8 {kv8:.3f}, kv4 {kv4:.3f}")
    assert kv8 >= 0.9
    assert kv4 >= 0.75

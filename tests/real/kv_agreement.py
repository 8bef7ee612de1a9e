"""Teacher-forced greedy agreement of quantised KV caches on the embedded model,
as a script: ``python -m tests.real.kv_agreement`` prints one JSON object
``{"bf16": share, "kv8": share, "kv4": share}`` (shares of answer positions, 0 to 1).

It runs in a child process of ``tests/real/test_kv_quant_real.py`` because the
test process holds MLX's reference BLAS (``tests/conftest.py``: the bit-for-bit
batching tests need it), where the 4-bit SmolLM2's products run MLX's quantised
CPU kernel at about 0.1 to 0.2 s of CPU a token (one pass over these four
prompts and answers cost ~140 s of CPU); the child loads the model as the
server does (MKL and float32 weights when ``MLXSPEC_BLAS`` allows), ~20 s.
"""

from __future__ import annotations

import json

import mlxspec  # noqa: F401  (installs the optimised BLAS before mlx.core loads)

#: Four short chat prompts (34 to 52 tokens with SmolLM2's template).
PROMPTS = [
    "Summarise: The river rose in the night. The river flooded the mill. The mill was rebuilt.",
    "List three colours.",
    "What is the capital of France?",
    "Say hello in three languages.",
]
ANSWER_TOKENS = 12


def _agreement(model, mode: str, cases: list[tuple[list[int], list[int]]]) -> float:
    import mlx.core as mx

    from mlxspec.engine.caches.kv_scheme import KvOptions, resolve_scheme

    scheme = resolve_scheme(KvOptions(mode), model, None)
    same = total = 0
    for prompt, answer in cases:
        cache = scheme.make_cache(model)
        logits = model(mx.array([*prompt, *answer[:-1]], dtype=mx.uint32)[None], cache=cache)
        picks = mx.argmax(logits[0, len(prompt) - 1 :], axis=-1).tolist()
        same += sum(int(a == b) for a, b in zip(picks, answer, strict=True))
        total += len(answer)
    return same / total


def measure() -> dict[str, float]:
    """Greedy-decode each prompt at full precision, then re-read prompt + answer
    through a bf16, a kv8 and a kv4 cache and count the positions whose argmax is
    the greedy token.

    Returns:
        dict[str, float]: the share of agreeing positions per KV mode.
    """
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.generate import generate_step

    from mlxspec.engine.model.cpu_weights import apply_cpu_weights
    from mlxspec.engine.model.loader import resolve_model

    model, tokenizer = load(str(resolve_model(None).path))
    apply_cpu_weights(model, "auto")  # float32 with an optimised BLAS, as the engine loads it
    cases = []
    for task in PROMPTS:
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": task}], add_generation_prompt=True
        )
        steps = generate_step(mx.array(prompt), model, max_tokens=ANSWER_TOKENS)
        cases.append((list(prompt), [int(t) for t, _ in steps]))
    return {mode: _agreement(model, mode, cases) for mode in ("bf16", "kv8", "kv4")}


if __name__ == "__main__":
    print(json.dumps(measure()))

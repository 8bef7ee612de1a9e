"""mlx-lm's own single-stream decode speed: ``serve_bench.py``'s server-overhead
baseline. Run as a script, it is :func:`direct_in_child`'s child (a JSON job on
stdin, the tokens/s on stdout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def mlx_lm_direct(model: str, prompt: str, max_tokens: int, bias: dict) -> float:
    """mlx-lm's own single-stream decode speed, the server-overhead baseline.

    Decodes the concurrency-1 level's first prompt (chat template applied) with
    greedy ``stream_generate``, the same ``max_tokens`` and the servers' EOS
    ``logit_bias`` as a logits processor, once to warm up and once measured.
    The model is loaded afresh and freed (MLX's buffer cache too) before
    returning: this process lives on while the servers run beside it.

    Args:
        model (str): MLX model folder.
        prompt (str): the user message.
        max_tokens (int): tokens to generate (EOS is forbidden, so exactly this many).
        bias (dict): ``{token id (str): bias}``, the servers' ``logit_bias``.

    Returns:
        float: decode tokens/s (``GenerationResponse.generation_tps``, prefill excluded).
    """
    import gc

    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    m, tok = load(model)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    procs = make_logits_processors({int(t): b for t, b in bias.items()})
    last = None
    for _ in range(2):  # warm-up, then measure
        for last in stream_generate(  # noqa: B007 (the loop keeps the final response)
            m, tok, ids, max_tokens=max_tokens, logits_processors=procs
        ):
            pass
    tps = last.generation_tps
    del m, tok, last, procs  # weights and the response's arrays; then MLX's buffer cache
    gc.collect()
    mx.clear_cache()
    return tps


def direct_in_child(model: str, prompt: str, max_tokens: int, bias: dict) -> float:
    """:func:`mlx_lm_direct` in a child process under ``mlxspec serve``'s MLX
    environment defaults (``SERVE_ENV_DEFAULTS``; a value set in this process's
    environment wins, as in the server), so the baseline runs the kernels the
    server runs and its memory is returned to the system when it ends.

    Returns:
        float: decode tokens/s, as :func:`mlx_lm_direct`.

    Raises:
        subprocess.CalledProcessError: when the child fails (its output is shown).
    """
    from mlxspec.config import apply_serve_env_defaults

    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    apply_serve_env_defaults(env)
    job = json.dumps({"model": model, "prompt": prompt, "max_tokens": max_tokens, "bias": bias})
    done = subprocess.run(
        [sys.executable, __file__],
        input=job,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode:
        print(done.stdout[-2000:], done.stderr[-4000:], file=sys.stderr)
        done.check_returncode()
    return float(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    job = json.loads(sys.stdin.read())
    print(mlx_lm_direct(job["model"], job["prompt"], job["max_tokens"], job["bias"]))

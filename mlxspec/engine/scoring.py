"""Teacher-forced answer scoring: how likely the model finds each candidate answer.

Decision scoring (``/v1/decisions``, ``/v1/systemone``) asks which of a few
fixed answers the model would give after a prompt. Each candidate is the
answer text followed by the chat template's end-of-answer marker (so that
"yes" must also *end* there, not continue as "yes, but"); its score is the sum
of the model's log-probabilities of its tokens given the prompt and the
preceding answer tokens, and the scores are normalised to probabilities with
a softmax.

Design (one question = one prompt plus N candidates):

1. Prefill the prompt once into an mlx-lm KV cache (in the engine's prefill
   chunks, :func:`~.lanes.default_prefill_step`: 512 tokens on a GPU, 128 on
   the CPU), keeping only the log-probabilities after the last prompt token,
   which score every candidate's first token. The work pauses after each chunk
   and candidate batch (:func:`loglikelihood_steps`): the engine runs the
   running requests' decode steps in between, and stops the work there when
   the client left.
2. Copy that cache N times along the batch axis and run all candidates'
   remaining tokens as one right-padded batch on top of it. Right padding is
   safe under a causal mask: a pad only follows the tokens that are scored.
   Groups are sized so that batch * (prompt + answer) stays under
   :data:`BATCH_TOKENS` and the logits under :data:`LOGIT_ROWS` rows.
3. Models whose caches are not plain ``KVCache`` (sliding-window or recurrent
   layers) cannot be copied that way; each candidate then prefills the prompt
   again and runs alone (same numbers, no prefix reuse).

All functions taking ``model`` run on the engine thread
(:meth:`~.generator.Engine.run_exclusive`); :func:`score_answers` is the
awaitable entry point for handlers.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

from mlxspec.engine.loop.lanes import default_prefill_step
from mlxspec.engine.prompt import off_loop
from mlxspec.engine.types import ContextLengthError, PromptError

#: Most cached + new tokens in one candidate batch (batch * (prompt + answer)).
BATCH_TOKENS = 16384
#: Most logit rows (batch * answer length) in one candidate batch.
LOGIT_ROWS = 1024

#: A marker no template will invent, rendered as an assistant answer to find
#: what the template writes after an answer.
_MARKER = "mlxspec_answer_marker_5c1e7b"


@dataclass(frozen=True)
class ScoredAnswers:
    """The outcome of scoring one prompt's candidate answers.

    Args:
        loglikelihoods (tuple[float, ...]): per candidate, the sum of the
            natural-log probabilities of its tokens (answer + ending).
        probabilities (tuple[float, ...]): ``softmax(loglikelihoods)``; sums to 1.
        input_tokens (int): tokens the model read: for each candidate, the
            prompt plus all of its tokens but the last (the reference's count).
    """

    loglikelihoods: tuple[float, ...]
    probabilities: tuple[float, ...]
    input_tokens: int


def answer_ending(tokenizer: Any) -> str:
    """The text the chat template writes after an assistant answer, through its
    first end-of-turn marker (e.g. ``<|im_end|>`` for ChatML).

    Rendered from a one-turn conversation whose answer is a marker; the text
    after the marker is cut after the first EOS token's text (layout after it,
    such as a newline, is not part of the answer). Templates that close an
    answer only with the next turn's header (GLM style) are rendered with one
    more user turn and cut the same way. Without a template, or when nothing
    matches, the EOS token's text is the ending.

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper``.

    Returns:
        str: the ending, appended to every candidate answer before encoding
        (encoding them together keeps BPE merges at the boundary honest).

    Raises:
        PromptError: the template drops or repeats the assistant's answer, or the
            model declares no EOS token.
    """
    ids = sorted(set(getattr(tokenizer, "eos_token_ids", ()) or ()))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    stops = [text for text in (tokenizer.decode([i]) for i in ids) if text]
    if getattr(tokenizer, "chat_template", None):
        turns = [{"role": "user", "content": "x"}, {"role": "assistant", "content": _MARKER}]
        suffix = _after_answer(tokenizer, turns)
        ending = _through_stop(suffix, stops)
        if ending is None:
            extra = _after_answer(tokenizer, [*turns, {"role": "user", "content": "x"}])
            ending = _through_stop(extra, stops)
        if ending is not None:
            return ending
        if suffix.strip():
            return suffix
    if not stops:
        raise PromptError("decision scoring needs an end-of-answer token; the model has none")
    return stops[0]


def _after_answer(tokenizer: Any, turns: list[dict]) -> str:
    text = tokenizer.apply_chat_template(
        turns, add_generation_prompt=False, tokenize=False, enable_thinking=False
    )
    at = text.find(_MARKER)
    if at < 0 or text.find(_MARKER, at + len(_MARKER)) >= 0:
        raise PromptError("decision scoring needs a chat template that keeps assistant answers")
    return text[at + len(_MARKER) :]


def _through_stop(suffix: str, stops: list[str]) -> str | None:
    hits = [(suffix.find(s), s) for s in stops if s in suffix]
    if not hits:
        return None
    at, stop = min(hits, key=lambda hit: hit[0])
    return suffix[: at + len(stop)]


def softmax(scores: Sequence[float]) -> tuple[float, ...]:
    """Normalise log-scores to probabilities (max-shifted, double precision).

    Args:
        scores (Sequence[float]): natural-log scores; at least one.

    Returns:
        tuple[float, ...]: non-negative, summing to 1 within rounding.
    """
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = math.fsum(weights)
    return tuple(w / total for w in weights)


async def score_answers(engine: Any, messages: list[dict], answers: Sequence[str]) -> ScoredAnswers:
    """Score ``answers`` as the assistant's reply to ``messages``.

    The prompt is the chat template's rendering with thinking disabled and the
    generation prompt added; each answer is encoded together with
    :func:`answer_ending`. The forward passes run on the engine thread.

    Args:
        engine (Engine): the started engine.
        messages (list[dict]): OpenAI chat messages.
        answers (Sequence[str]): candidate answer texts (at least one).

    Returns:
        ScoredAnswers: per-answer log-likelihoods and probabilities, input tokens.

    Raises:
        PromptError: the template failed, or a media part on a text-only model.
        ContextLengthError: prompt + an answer exceeds the context window (or
            the operator's ``--max-context`` / memory-budget cap).
    """
    prompt, candidates = await off_loop(_decision_tokens, engine, messages, answers)
    admission = engine.admission
    longest = len(prompt) + max(len(c) for c in candidates) - 1
    if longest > admission.context_limit:  # the model's window or the operator's cap
        raise ContextLengthError(
            f"{admission.context_words()}, but the decision "
            f"prompt and its longest answer need {longest} tokens.",
            param=None,
        )
    steps = partial(loglikelihood_steps, engine.model, prompt, candidates)
    scores = await engine.run_exclusive(steps)  # a stepped job: a chunk per engine turn
    used = sum(len(prompt) + len(c) - 1 for c in candidates)
    return ScoredAnswers(tuple(scores), softmax(scores), used)


def _decision_tokens(
    engine: Any, messages: list[dict], answers: Sequence[str]
) -> tuple[list[int], list[list[int]]]:
    """The prompt's and each candidate's token ids (a prompt thread's work)."""
    prompt = engine.chat_prompt(messages, template_kwargs={"enable_thinking": False})
    if getattr(prompt, "media", None) is not None:  # scored on the text model: never silently
        raise PromptError(
            f"model {engine.info.id}: decision questions with images are not scored yet "
            "(docs/deviations.md)",
            param="messages",
        )
    ending = answer_ending(engine.tokenizer)
    encode = engine.tokenizer.encode
    return prompt, [list(encode(a + ending, add_special_tokens=False)) for a in answers]


def loglikelihood_steps(
    model: Any,
    prompt: Sequence[int],
    candidates: Sequence[Sequence[int]],
    shared_prefix: bool | None = None,
) -> Generator[None, None, list[float]]:
    """Sum of log-probabilities of each candidate's tokens after ``prompt``, as a
    generator that pauses after each prefill chunk and candidate batch.

    ``score(c) = sum_j log softmax(f(prompt + c[:j]))[c[j]]`` in float32.
    Engine thread only: a stepped ``Engine.run_exclusive`` job, so the engine
    runs the other requests' decode steps between the pauses and closes it
    when its caller leaves.

    Args:
        model: an mlx-lm model.
        prompt (Sequence[int]): prompt token ids (at least one).
        candidates (Sequence[Sequence[int]]): answer token ids, each non-empty.
        shared_prefix (bool | None): prefill the prompt once and batch the
            candidates on copies of its KV cache; ``None`` picks it whenever
            every layer's cache is a plain ``KVCache``. Default: ``None``.

    Returns:
        list[float]: (the generator's return value) one log-likelihood per
        candidate, in order.
    """
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    cache = make_prompt_cache(model)
    if shared_prefix is None:
        shared_prefix = all(type(c) is KVCache for c in cache)
    if not shared_prefix:
        out = []
        for candidate in candidates:
            fresh = make_prompt_cache(model)
            first = yield from _prefill(model, prompt, fresh)
            out.extend(_score_batch(model, fresh, first, [candidate], copy=False))
            yield
        return out
    first = yield from _prefill(model, prompt, cache)
    out = []
    for group in _groups(candidates, len(prompt)):
        out.extend(_score_batch(model, cache, first, group, copy=True))
        yield
    return out


def _prefill(model: Any, prompt: Sequence[int], cache: list) -> Generator[None, None, Any]:
    """Run ``prompt`` into ``cache``, pausing after each chunk; returns log-probs
    ``[V]`` (float32) of the token after it."""
    import mlx.core as mx

    tokens = mx.array(list(prompt), dtype=mx.uint32)[None]
    head = tokens.shape[1] - 1
    step = default_prefill_step()
    for start in range(0, head, step):
        model(tokens[:, start : min(start + step, head)], cache=cache)
        mx.eval([c.state for c in cache])
        yield
    logits = model(tokens[:, head:], cache=cache)[0, -1].astype(mx.float32)
    return logits - mx.logsumexp(logits)


def _groups(candidates: Sequence[Sequence[int]], prompt_len: int) -> list[list[Sequence[int]]]:
    """Split candidates into batches within :data:`BATCH_TOKENS` / :data:`LOGIT_ROWS`."""
    groups: list[list[Sequence[int]]] = []
    current: list[Sequence[int]] = []
    for candidate in candidates:
        width = max(len(c) for c in [*current, candidate])
        size = len(current) + 1
        if current and (size * (prompt_len + width) > BATCH_TOKENS or size * width > LOGIT_ROWS):
            groups.append(current)
            current = []
        current.append(candidate)
    groups.append(current)
    return groups


def _score_batch(
    model: Any, cache: list, first: Any, group: Sequence[Sequence[int]], copy: bool
) -> list[float]:
    """Score ``group`` on top of a prefilled ``cache`` (copied per row if ``copy``)."""
    import mlx.core as mx

    n, width = len(group), max(len(c) for c in group)
    padded = mx.array([list(c) + [0] * (width - len(c)) for c in group], dtype=mx.uint32)
    heads = cast(list[float], first[padded[:, 0]].tolist())  # [n]
    if width == 1:
        return [float(h) for h in heads]
    rows = _batched_cache(cache, n) if copy else cache
    logits = model(padded[:, :-1], cache=rows).astype(mx.float32)
    picked = mx.take_along_axis(logits, padded[:, 1:, None], axis=-1)[..., 0]
    logprobs = cast(list[list[float]], (picked - mx.logsumexp(logits, axis=-1)).tolist())
    # Summed in double precision: long answers of a peaked model reach |score| ~ 1e3.
    return [
        math.fsum([head, *row[: len(c) - 1]])
        for head, row, c in zip(heads, logprobs, group, strict=True)
    ]


def _batched_cache(cache: list, n: int) -> list:
    """``n`` independent copies of a batch-1 ``KVCache`` list, stacked on axis 0."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    copies = []
    for layer in cache:
        keys, values = layer.keys_and_values()
        copy = KVCache()
        copy.keys, copy.values = mx.repeat(keys, n, axis=0), mx.repeat(values, n, axis=0)
        copy.offset = layer.offset
        copies.append(copy)
    return copies

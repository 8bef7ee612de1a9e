"""A validated request body -> the engine requests it asks for (pure).

:func:`to_generation_request` is the one function that turns a chat or
completion body into an engine :class:`GenerationRequest` (the role of vLLM's
``to_sampling_params``); :func:`to_constraint` reads its structured-output
fields, :func:`session_key` its prompt-cache session, and
:func:`choice_requests` makes the ``n`` sibling requests of its choices. The
document has already checked types and ranges; this only applies defaults and
precedence. Nothing here touches the engine, the request's scope or I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from mlxspec.engine import (
    Constraint,
    GenerationDefaults,
    GenerationRequest,
    LogitsParams,
    ModelInfo,
    SamplingParams,
)
from mlxspec.errors import ApiError

#: mlx_lm.server's sampler and penalty fields: the chat-shaped surfaces
#: (Anthropic Messages, Responses) carry them onto the chat body unchanged.
SAMPLER_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "seed",
    "repetition_penalty",
    "repetition_context_size",
    "presence_penalty",
    "presence_context_size",
    "frequency_penalty",
    "frequency_context_size",
    "xtc_probability",
    "xtc_threshold",
)

#: The body fields that label a prompt-cache session (see :func:`session_key`).
SESSION_FIELDS = ("session_id", "prompt_cache_key")

#: The body field that selects LoRA adapters (:mod:`.adapters.select`): the
#: chat-shaped surfaces carry it onto the chat body (and their handlers the
#: ``model``, which may name an adapter too: :func:`.adapters.select.with_model`).
ADAPTER_FIELDS = ("adapter",)


def to_generation_request(
    body: Mapping[str, Any],
    prompt: list[int],
    defaults: GenerationDefaults,
    model: ModelInfo | None = None,
    session: str | None = None,
    adapter: tuple[str, ...] = (),
) -> GenerationRequest:
    """Convert a validated chat or completion body into an engine request.

    Precedence: request field, then ``defaults`` (server flags over the
    model's generation_config.json), then mlx_lm.server's defaults.
    ``max_completion_tokens`` wins over ``max_tokens`` (OpenAI deprecates the
    latter); ``top_logprobs: -1`` means unset (mlx-lm's sentinel).

    Args:
        body (Mapping): the request body, already validated by the document.
        prompt (list[int]): prompt token ids.
        defaults (GenerationDefaults): the engine's sampling defaults.
        model (ModelInfo | None): the served model, for limits the document
            cannot state (its vocabulary size). Default: ``None`` (unchecked).
        session (str | None): the prompt-cache session (:func:`session_key`).
            Default: ``None``.
        adapter (tuple[str, ...]): the mounted adapters it selects
            (``handlers.adapters.select.request_adapters``). Default: ``()``.

    Returns:
        GenerationRequest: a frozen engine request.

    Raises:
        ApiError: ``logit_bias`` keys that are not integers (mlx-lm's message)
            or not token ids of the model (mlx would index out of bounds).
    """

    def pick(name: str, fallback: Any) -> Any:
        value = body.get(name)
        return fallback if value is None else value

    vocab = model.vocab_size if model is not None else None
    max_tokens = body.get("max_completion_tokens")
    if max_tokens is None:
        max_tokens = pick("max_tokens", defaults.max_tokens)
    stop = body.get("stop") or ()
    sampling = SamplingParams(
        temperature=float(pick("temperature", pick_default(defaults.temperature, 0.0))),
        top_p=float(pick("top_p", pick_default(defaults.top_p, 1.0))),
        top_k=_top_k(int(pick("top_k", pick_default(defaults.top_k, 0))), vocab),
        min_p=float(pick("min_p", pick_default(defaults.min_p, 0.0))),
        xtc_probability=float(pick("xtc_probability", 0.0)),
        # XTC needs two tokens above the threshold, impossible above 0.5, where
        # mlx-lm's apply_xtc raises instead: 0.5 behaves the same.
        xtc_threshold=min(float(pick("xtc_threshold", 0.1)), 0.5),
        seed=body.get("seed"),
    )
    logits = LogitsParams(
        logit_bias=_logit_bias(body.get("logit_bias"), vocab),
        repetition_penalty=float(pick("repetition_penalty", 0.0)),
        repetition_context_size=_window(pick("repetition_context_size", 20)),
        presence_penalty=float(pick("presence_penalty", 0.0)),
        presence_context_size=_window(pick("presence_context_size", 20)),
        frequency_penalty=float(pick("frequency_penalty", 0.0)),
        frequency_context_size=_window(pick("frequency_context_size", 20)),
    )
    return GenerationRequest(
        prompt=tuple(prompt),
        media=getattr(prompt, "media", None),
        max_tokens=max_tokens,
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        sampling=sampling,
        logits=logits,
        # OpenAI's legacy integer (even 0) asks for logprobs too.
        logprobs=body.get("logprobs") is True or type(body.get("logprobs")) is int,
        top_logprobs=_top_logprobs(body),
        session=session,
        constraint=to_constraint(body),
        # n > 1: the choices are sibling requests on one prompt (choice_requests)
        shared_prefill=choice_count(body) > 1,
        # an open final message (engine.prompt.render_chat) is continued
        continuation=bool((body.get("chat_template_kwargs") or {}).get("continue_final_message")),
        adapter=adapter,
    )


#: The body fields that ask for structured output (reference, "Structured output").
STRUCTURED_FIELDS = (
    "response_format",
    "guided_grammar",
    "guided_regex",
    "guided_choice",
    "structured_outputs",
)


def to_constraint(body: Mapping[str, Any]) -> Constraint | None:
    """The grammar a validated chat or completion body asks the output to match.

    Precedence when several fields are set (reference, "Structured output"):
    ``guided_grammar`` > ``response_format`` ``json_schema`` > ``json_object`` >
    ``structured_outputs`` > ``guided_regex`` > ``guided_choice``;
    ``response_format: {"type": "text"}`` adds no constraint.

    Args:
        body (Mapping): the request body, already validated by the document.

    Returns:
        Constraint | None: ``None`` when the body asks for none. A schema's spec
        is its JSON text with key order kept (xgrammar generates properties in
        the order the schema lists them); a missing ``json_schema.schema`` means
        any JSON value.
    """
    grammar = body.get("guided_grammar")
    if grammar is not None:
        return Constraint("ebnf", grammar)
    fmt = body.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema") or {}
        schema = spec.get("schema")
        return Constraint(
            "json_schema",
            json.dumps({} if schema is None else schema),
            any_whitespace=spec.get("any_whitespace") is not False,
        )
    if fmt.get("type") == "json_object":
        return Constraint("json_object")
    if body.get("structured_outputs") is not None:
        return Constraint("json_schema", json.dumps(body["structured_outputs"]))
    if body.get("guided_regex") is not None:
        return Constraint("regex", body["guided_regex"])
    if body.get("guided_choice") is not None:
        return Constraint("choice", json.dumps(body["guided_choice"], ensure_ascii=False))
    return None


def _top_logprobs(body: Mapping[str, Any]) -> int:
    """``top_logprobs`` (``-1``/null is unset, 0); OpenAI's legacy integer
    ``logprobs: k`` (completions, ``--logprobs-format openai``) means k unless
    ``top_logprobs`` is set."""
    top = body.get("top_logprobs")
    legacy = body.get("logprobs")
    if (top is None or top < 0) and type(legacy) is int:
        return legacy
    return max(0, int(-1 if top is None else top))


#: Largest penalty window: mlx slices take 32-bit indices, and a window
#: longer than the sequence covers all of it anyway.
MAX_PENALTY_WINDOW = 2**31 - 1


def _window(size: Any) -> int:
    return min(int(size), MAX_PENALTY_WINDOW)


def _top_k(k: int, vocab: int | None) -> int:
    """``k`` covering the whole vocabulary keeps every token: that is "off" (0),
    and mlx-lm's ``apply_top_k`` raises for ``k >= vocab_size``."""
    return 0 if vocab is not None and k >= vocab else k


def pick_default(value: Any, fallback: Any) -> Any:
    """``value`` unless it is ``None``."""
    return fallback if value is None else value


def _logit_bias(
    raw: Mapping[str, float] | None, vocab: int | None
) -> tuple[tuple[int, float], ...]:
    if not raw:
        return ()
    try:
        bias = tuple((int(k), float(v)) for k, v in raw.items())
    except (TypeError, ValueError) as exc:
        raise ApiError(
            "invalid_request", "logit_bias must be a dict of int to float", param="logit_bias"
        ) from exc
    # mlx's logits.at[:, ids].add does not bounds-check: a bad id corrupts memory.
    for (token, _), key in zip(bias, raw, strict=True):
        if token < 0 or (vocab is not None and token >= vocab):
            ids = f"ids are 0 to {vocab - 1}" if vocab is not None else "ids are non-negative"
            raise ApiError(
                "invalid_request",
                f"logit_bias key {key} is not a token id of this model (token {ids})",
                param="logit_bias",
            )
    return bias


def session_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The prompt-cache session a request belongs to, or ``None``.

    Precedence (reference, "Prompt cache sessions"): body ``session_id``, body
    ``prompt_cache_key``, header ``x-session-affinity``, header ``session_id``.

    Args:
        body (Mapping): the request body.
        headers (Mapping[str, str]): request headers, lower-case names.
    """
    for value in (
        body.get("session_id"),
        body.get("prompt_cache_key"),
        headers.get("x-session-affinity"),
        headers.get("session_id"),
    ):
        if isinstance(value, str) and value:
            return value
    return None


def choice_count(body: Mapping[str, Any]) -> int:
    """``n`` of a validated body (omitted or null is 1; the document bounds it)."""
    return int(body.get("n") or 1)


#: ``mx.random.seed`` takes an unsigned 64-bit integer.
_SEED_SPACE = 2**64


def choice_request(request: GenerationRequest, index: int) -> GenerationRequest:
    """The engine request of choice ``index``: ``request`` with the seed moved
    to ``seed + index`` (mod 2**64) when one is set, else ``request`` itself."""
    seed = request.sampling.seed
    if seed is None or index == 0:
        return request
    sampling = replace(request.sampling, seed=(seed + index) % _SEED_SPACE)
    return replace(request, sampling=sampling)


def choice_requests(first: GenerationRequest, n: int) -> list[GenerationRequest]:
    """The engine requests of ``n`` choices on one prompt.

    Each choice is its own request; with a ``seed``, choice i samples with
    ``seed + i`` (:func:`choice_request`), so the choices differ and the whole
    request stays reproducible; greedy decoding gives n identical choices.

    Args:
        first (GenerationRequest): choice 0's request.
        n (int): the number of choices (:func:`choice_count`).

    Returns:
        list[GenerationRequest]: one per choice, in index order; ``first`` first.
    """
    return [choice_request(first, index) for index in range(n)]

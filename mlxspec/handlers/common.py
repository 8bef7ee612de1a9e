"""Wire <-> engine translation shared by the generation surfaces.

:func:`to_generation_request` is the one pure function that turns a validated
request body into an engine :class:`GenerationRequest` (the role of vLLM's
``to_sampling_params``). The document has already checked types and ranges;
this only applies defaults and precedence.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from connexion.context import receive, scope

from mlxspec import __version__
from mlxspec.engine import (
    Cancelled,
    Constraint,
    Delta,
    Engine,
    Failed,
    Finished,
    GenerationDefaults,
    GenerationRequest,
    LogitsParams,
    ModelInfo,
    RequestHandle,
    SamplingParams,
    TokenLogprob,
)
from mlxspec.errors import ApiError
from mlxspec.http.metrics import GenerationWatch, Metrics

SYSTEM_FINGERPRINT = f"mlxspec-{__version__}"
T = TypeVar("T")


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


def current_engine() -> Engine:
    """The engine serving this request (placed in the ASGI scope by the app)."""
    return scope["state"]["engine"]


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
        min_p=float(pick("min_p", 0.0)),
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
        max_tokens=max_tokens,
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        sampling=sampling,
        logits=logits,
        # OpenAI's legacy integer (even 0) asks for logprobs too.
        logprobs=body.get("logprobs") is True or type(body.get("logprobs")) is int,
        top_logprobs=_top_logprobs(body),
        session=session,
        constraint=to_constraint(body),
        # n > 1: the choices are sibling requests on one prompt (handlers.choices)
        shared_prefill=int(body.get("n") or 1) > 1,
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


@dataclass
class Collected:
    """A whole generation gathered from a handle's events."""

    text: str = ""
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finished: Finished | None = None


async def cancel_on_disconnect(handle: RequestHandle) -> None:
    """Wait for the client's ``http.disconnect`` and cancel ``handle``.

    The body was already read by validation, so the next ASGI message for a
    plain request is the disconnect (ASGI HTTP spec, "Disconnected").
    """
    while (await receive())["type"] != "http.disconnect":
        pass
    handle.cancel()


async def until_disconnect(work: Awaitable[T]) -> T:
    """Await ``work`` unless the client disconnects first (then cancel it).

    For handlers whose engine work is not a :class:`RequestHandle` (scoring,
    embeddings through ``Engine.run_exclusive``).

    Raises:
        ApiError: ``cancelled`` (499) when the client left first.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_disconnected())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
        if not task.done():
            task.cancel()
    if task not in done:
        raise ApiError("cancelled", "request cancelled")
    return task.result()


async def _disconnected() -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def outputs(handle: RequestHandle) -> AsyncIterator[Delta | Finished]:
    """A handle's ``Delta`` and ``Finished`` events; the failure events become errors.

    Every surface reads its events here, so this is where the app's metrics
    observe time to first token, inter-token latency and token counts.

    Raises:
        ApiError: ``server_error`` for ``Failed``, ``cancelled`` (499) for ``Cancelled``.
    """
    watch = _watch(handle)
    async for event in handle:
        if isinstance(event, Failed):
            raise ApiError("server_error", event.message)
        if isinstance(event, Cancelled):
            raise ApiError("cancelled", "request cancelled")
        if watch is not None:
            watch.observe(event)
        yield event


def current_metrics() -> Metrics | None:
    """The app's metrics; ``None`` outside a request (unit tests drive handles
    directly) or in an app without metrics."""
    try:
        return scope["state"].get("metrics")
    except RuntimeError:  # connexion's context is unbound outside a request
        return None


def _watch(handle: RequestHandle) -> GenerationWatch | None:
    """The app's latency/token watch for ``handle`` (see :func:`current_metrics`)."""
    metrics = current_metrics()
    return metrics.watch(handle) if metrics is not None else None


async def collect(handle: RequestHandle) -> Collected:
    """Gather a non-streamed generation. A client that disconnects, or a
    cancelled awaiting task, cancels the engine request.

    Raises:
        ApiError: ``server_error`` when the engine reports a failure.
    """
    out, pieces = Collected(), []
    watcher = asyncio.ensure_future(cancel_on_disconnect(handle))
    try:
        async for event in outputs(handle):
            if isinstance(event, Delta):
                pieces.append(event.text)
                out.logprobs.extend(event.logprobs)
            else:
                out.finished = event
    except asyncio.CancelledError:
        handle.cancel()
        raise
    finally:
        watcher.cancel()
    out.text = "".join(pieces)
    return out


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


def request_headers() -> dict[str, str]:
    """The current request's headers, lower-case names (last value wins)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}


def usage(finished: Finished) -> dict[str, Any]:
    """The ``usage`` object: OpenAI's fields plus ``prompt_tokens_details`` and ``lane``."""
    return {
        "prompt_tokens": finished.prompt_tokens,
        "completion_tokens": finished.completion_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finished.cached_tokens},
        "lane": finished.lane,
    }


def logprobs_block(entries: list[TokenLogprob], top_logprobs: int) -> dict[str, Any]:
    """mlx_lm.server's logprobs block (``generate_response``).

    With ``top_logprobs > 0`` each entry is the top-1 candidate merged with
    the sorted top list (mlx-lm's ``dict(top[0], top_logprobs=top)``);
    otherwise ``{id, logprob}`` of each generated token.
    """
    if top_logprobs > 0:
        content = []
        for e in entries:
            top = [{"id": t.id, "token": t.token, "logprob": t.logprob} for t in e.top]
            content.append(dict(top[0], top_logprobs=top) if top else {})
        return {"content": content}
    return {"content": [{"id": e.id, "logprob": e.logprob} for e in entries]}


def new_id(prefix: str) -> str:
    """A response id such as ``chatcmpl-<uuid4>``."""
    return f"{prefix}-{uuid.uuid4()}"


def now() -> int:
    """Unix time in seconds, for ``created``."""
    return int(time.time())


JSON = {"Content-Type": "application/json"}

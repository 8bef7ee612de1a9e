"""Plain answers the engine gives the read-only views, in place of its objects.

``GET /stats``, ``GET /fit``, ``/metrics`` and the chat path need numbers and
strings the engine's admission, counters, model memory and tokenizer hold;
they get them as the frozen dataclasses here (:class:`StatsSnapshot`,
:class:`FitSnapshot`, :class:`ChatFormat`), read at one moment, so nothing
outside the engine reaches into those objects
(:class:`~mlxspec.engine.interface.EngineProtocol`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxspec.engine.model.fit import ModelMemory
from mlxspec.parsers import template_text


@dataclass(frozen=True)
class StatsSnapshot:
    """Request counters, admission and batch state at one moment (``GET /stats``,
    ``/metrics``).

    Args:
        submitted (int): requests accepted by ``submit`` since start.
        outcomes (dict[str, int]): ended requests by outcome (``completed``,
            ``cancelled``, ``failed``).
        in_flight (int): requests submitted and not yet ended, plus the
            decisions and embeddings holding a place (``hold``).
        waiting (int): requests in flight without a decode slot yet.
        running (int): requests in flight holding a decode slot.
        max_queue (int): most requests that may wait (``--max-queue``).
        rejected (dict[str, int]): refusals at admission by reason
            (``queue_full``, ``context_over_budget``).
        enforced_context (int | None): the operator's context cap in force, in
            tokens; ``None`` when only the model's window binds.
        max_batch (int): most requests decoding at once; ``1`` is serial.
        kv_bytes (int): KV cache bytes the running requests project together.
        kv_budget_bytes (int | None): the cap on ``kv_bytes`` (the KV room of
            ``--kv-budget`` and/or ``--memory-budget``); ``None`` without one.
        steps (dict[str, float | int]): batched-lane step times
            (``steps``, ``mean_rows``, ``generate_ms_mean``, ``route_ms_mean``).
        solo_steps (dict[str, float | int]): the same for requests decoding alone.
        speculation (dict[str, Any] | None): the mounted draft source's counters
            (:meth:`~.speculative.SpecStats.snapshot`); ``None`` without one.
            Default: ``None``.
        fill (dict[str, Any] | None): the fill counters under ``--fill strict``
            (:meth:`~.speculative.fill.FillStats.snapshot`); ``None`` without it.
            Default: ``None``.
    """

    submitted: int
    outcomes: dict[str, int]
    in_flight: int
    waiting: int
    running: int
    max_queue: int
    rejected: dict[str, int]
    enforced_context: int | None
    max_batch: int
    kv_bytes: int
    kv_budget_bytes: int | None
    steps: dict[str, float | int]
    solo_steps: dict[str, float | int]
    speculation: dict[str, Any] | None = None
    fill: dict[str, Any] | None = None


@dataclass(frozen=True)
class FitSnapshot:
    """What bounds a request's context: the model's memory facts and the
    operator's limits (``GET /fit``, ``/stats``' admission section).

    Args:
        memory (ModelMemory): weight bytes, KV cache bytes per token, KV dtype, layers.
        memory_budget (int | None): ``--memory-budget`` in bytes; ``None``: the
            machine's free memory bounds the model.
        context_limit (int): most prompt + completion tokens a request may use
            (the model's window or the operator's cap, the smaller).
        kv_quant (dict): ``/stats`` ``kv_quant``
            (:meth:`~.caches.kv_scheme.KvScheme.describe`). Default: empty.
    """

    memory: ModelMemory
    memory_budget: int | None
    context_limit: int
    kv_quant: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ChatFormat:
    """What the served tokenizer says about its chat format: what
    :func:`mlxspec.parsers.detect` reads to pick the tool-call and reasoning
    parsers (the attribute names are ``TokenizerWrapper``'s).

    Args:
        chat_template (str): the chat template text (Hugging Face's named
            templates joined by newlines); ``""`` without one.
        tool_parser (Callable | None): mlx-lm's inferred tool-call parser
            (``TokenizerWrapper.tool_parser``).
        think_start (str | None): mlx-lm's thinking start marker
            (``TokenizerWrapper.think_start``).
    """

    chat_template: str
    tool_parser: Callable[..., Any] | None = None
    think_start: str | None = None


def read_stats(engine: Any) -> StatsSnapshot:
    """The engine's counters and admission state now (engine thread writes,
    any thread reads: each number is one read, as ``GET /stats`` always did).

    Args:
        engine (Engine): the engine (not imported here: it imports this module).

    Returns:
        StatsSnapshot: plain numbers and dict copies.
    """
    adm, in_flight, counters = engine.admission, engine.in_flight, engine.counters
    kv_budget = None if adm.kv_room is None else adm.kv_room * adm.kv_bytes_per_token
    spec = engine.speculator
    return StatsSnapshot(
        submitted=engine.submitted,
        outcomes={k: int(counters.get(k, 0)) for k in ("completed", "cancelled", "failed")},
        in_flight=in_flight,
        waiting=adm.waiting(in_flight),
        running=adm.running(in_flight),
        max_queue=adm.limits.max_queue,
        rejected=dict(adm.rejected),
        enforced_context=adm.enforced_context,
        max_batch=engine.max_batch,
        kv_bytes=engine.running_kv_tokens * engine.memory.kv_bytes_per_token,
        kv_budget_bytes=kv_budget,
        steps=engine.step_times.snapshot(),
        solo_steps=engine.solo_times.snapshot(),
        speculation=None if spec is None or spec.stats is None else spec.stats.snapshot(),
        fill=None if spec is None or spec.fill is None else spec.fill.stats.snapshot(),
    )


def read_chat_format(tokenizer: Any) -> ChatFormat:
    """The chat format facts of an mlx-lm ``TokenizerWrapper`` (or anything
    with its ``chat_template``, ``tool_parser`` and ``think_start`` attributes).

    Args:
        tokenizer: the served tokenizer.

    Returns:
        ChatFormat: its template text, inferred tool parser and thinking marker.
    """
    start = getattr(tokenizer, "think_start", None)
    return ChatFormat(
        chat_template=template_text(getattr(tokenizer, "chat_template", None)),
        tool_parser=getattr(tokenizer, "tool_parser", None),
        think_start=start if isinstance(start, str) else None,
    )

"""What the engine's lanes share: the model's parts, the prefill chunk size, how a
request starts, the loop's counters and the hand-over of a running request.

:class:`LaneParts` is what both lanes need to start a request (model,
tokenizer, stop tokens, prompt cache, grammar compiler), and
:func:`start_request` is the one place a request starts: its best cached
prefix, grammar, :class:`~.rows.Row`, sampler and logits processors. A
:class:`Handoff` is a request ready to decode: either a new one (its prompt
tail after a prompt-cache hit), which the solo lane decodes from and the batch
adopts (:meth:`~.batching.BatchLane.adopt`), or a :class:`~.solo.SoloRun`
moved over mid-generation with its KV cache, logits processors and row.
:class:`LoopStats` is what the loop counts for ``GET /stats``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mlxspec.engine.adapters.registry import NO_ADAPTER, AdapterPick, AdapterRegistry
from mlxspec.engine.caches.kv import cache_length
from mlxspec.engine.caches.kv_scheme import KvScheme
from mlxspec.engine.caches.prompt_cache import CacheNamespace, PromptCache
from mlxspec.engine.loop.rows import Row
from mlxspec.engine.sampling.grammar import GrammarCache, GrammarProcessor
from mlxspec.engine.sampling.sampler import build_logits_processors, build_sampler
from mlxspec.engine.speculative import FillCounts, SpecCounts, Speculator, fillable, speculable

if TYPE_CHECKING:
    from mlxspec.engine.loop.handles import RequestHandle

log = logging.getLogger("mlxspec.engine")

#: Prompt tokens per prefill chunk on a GPU. Cancellation is noticed between
#: chunks, so a smaller chunk frees the engine sooner when a client leaves mid-prefill.
PREFILL_STEP = 512
#: Prompt tokens per prefill chunk on the CPU. A CPU prefills at the same rate in
#: chunks of 128 as of 512 (embedded SmolLM2 with MKL on 2 cores: 2000 tokens in
#: 23.3 s against 25.0 s), while a batched chunk of 8 prompts x 512 tokens took
#: ~30 s, the time a client that left mid-prefill kept its slot and the queue waited.
CPU_PREFILL_STEP = 128
#: Most prompts the batched lane prefills together (mlx_lm.server's
#: ``--prompt-concurrency`` default).
PREFILL_BATCH = 8


def default_prefill_step() -> int:
    """:data:`PREFILL_STEP` when MLX runs on a GPU, else :data:`CPU_PREFILL_STEP`."""
    import mlx.core as mx

    return PREFILL_STEP if mx.default_device().type == mx.gpu else CPU_PREFILL_STEP


@dataclass
class StepTimes:
    """Where a lane's steps spend their time, since start (engine thread
    writes, ``GET /stats`` reads).

    A batched step is one :meth:`~.decode.DecodeBatch.step` (a decode step of
    every running row queued, a prefill chunk of rows joining, the previous
    step's tokens read); its ``generate_s`` includes the host's wait for the
    tokens and ``route_s`` excludes it. A lone request's decode step is one
    ``next()`` of its ``generate_step`` (:mod:`.solo`). Either is followed by
    routing its tokens to the requests (detokenizing, stop strings, logprobs,
    events: :class:`~.rows.Row`). Measured with ``time.perf_counter``, so a
    profiler that cannot see inside MLX still shows whether the model or our
    per-token work takes the time.

    Attributes:
        steps (int): steps run.
        rows (int): tokens routed (one per row that got a token in a step).
        generate_s (float): seconds in the model step (``next()``).
        route_s (float): seconds routing tokens and ending rows.
    """

    steps: int = 0
    rows: int = 0
    generate_s: float = 0.0
    route_s: float = 0.0

    def snapshot(self) -> dict[str, float | int]:
        """``steps``, ``mean_rows`` per step, ``generate_ms_mean`` and
        ``route_ms_mean`` per step (milliseconds; 0 before the first step)."""
        n = max(self.steps, 1)
        return {
            "steps": self.steps,
            "mean_rows": self.rows / n,
            "generate_ms_mean": 1000 * self.generate_s / n,
            "route_ms_mean": 1000 * self.route_s / n,
        }

    def add(self, rows: int, generate_s: float, route_s: float) -> None:
        """Count one step that handed out ``rows`` tokens.

        Args:
            rows (int): tokens routed in the step.
            generate_s (float): seconds in the model step.
            route_s (float): seconds routing its tokens.
        """
        self.steps += 1
        self.rows += rows
        self.generate_s += generate_s
        self.route_s += route_s


#: How a request can end; each one submitted ends in exactly one.
OUTCOMES = ("completed", "cancelled", "failed")


@dataclass
class LoopStats:
    """What the engine loop counts since start (the engine thread writes, ``GET
    /stats`` reads them through the engine).

    Attributes:
        outcomes (dict[str, int]): requests ended, by outcome (:data:`OUTCOMES`).
        handoffs (int): lone requests moved into the batch mid-request (:mod:`.solo`).
        steps (StepTimes): batched-lane steps (``batch.steps``).
        solo_steps (StepTimes): decode steps of requests running alone
            (``batch.solo_steps``).
    """

    outcomes: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    handoffs: int = 0
    steps: StepTimes = field(default_factory=StepTimes)
    solo_steps: StepTimes = field(default_factory=StepTimes)


@dataclass(frozen=True)
class LaneParts:
    """The engine's pieces a lane needs to run requests (engine thread only).

    Args:
        model: the mlx-lm model.
        tokenizer: its ``TokenizerWrapper``.
        eos (frozenset[int]): end-of-sequence ids (also the batch's stop tokens).
        xtc_special (tuple[int, ...]): tokens XTC never removes.
        prefill_step (int): prompt tokens per prefill chunk; cancellation and
            arrivals are seen between chunks.
        prompt_cache (PromptCache): kept KV caches for prefix reuse.
        namespace (CacheNamespace): the engine's cache namespace.
        grammars (GrammarCache | None): compiles constraints into per-request
            processors; ``None`` ignores constraints.
        prefill_batch (int): most prompts prefilled together. Default: :data:`PREFILL_BATCH`.
        adapters (AdapterRegistry | None): the mounted LoRA adapters; ``None``
            serves the base model only. Default: ``None``.
        speculator (Speculator | None): the draft source's hook into the batched
            decode step; ``None`` without ``--draft-model`` / ``--draft-kind``.
            Default: ``None``.
        vision (Any): the vision wing (:class:`~mlxspec.engine.model.vision.VisionWing`)
            that runs requests with media; ``None`` for a text-only model. Default: ``None``.
        kv (KvScheme): which layers keep K/V quantised (``--kv-quant``); every
            lane makes its caches with it. Default: none quantised.
    """

    model: Any
    tokenizer: Any
    eos: frozenset[int]
    xtc_special: tuple[int, ...]
    prefill_step: int
    prompt_cache: PromptCache
    namespace: CacheNamespace
    grammars: GrammarCache | None = None
    prefill_batch: int = PREFILL_BATCH
    adapters: AdapterRegistry | None = None
    speculator: Speculator | None = None
    vision: Any = None
    kv: KvScheme = KvScheme()

    def speculates(self, handle: RequestHandle) -> bool:
        """Whether ``handle`` 's request speculates (a draft source is mounted
        and :func:`~mlxspec.engine.speculative.speculable` allows it) or fills
        (:meth:`fills`): either runs on the batch's verify step."""
        spec = self.speculator
        if spec is None:
            return False
        return (spec.source is not None and speculable(handle.request)) or self.fills(handle)

    def fills(self, handle: RequestHandle) -> bool:
        """Whether ``handle`` 's request fills forced spans (``--fill strict``
        and :func:`~mlxspec.engine.speculative.fillable`)."""
        spec = self.speculator
        return spec is not None and spec.fill is not None and fillable(handle.request)

    def keep(
        self,
        tokens: Sequence[int],
        cache: list[Any],
        session: str | None,
        pick: AdapterPick = NO_ADAPTER,
        media: str | None = None,
    ) -> None:
        """Keep ``cache`` (computed with ``pick``'s adapters, about the media of
        digest ``media``) in the prompt cache if it holds a prefix of ``tokens``
        (and stores exactly that prefix); never raises, since the cache is an
        optimisation and must not fail a request."""
        held = cache_length(cache)
        if held is None or held > len(tokens):
            return
        try:
            namespace = self.namespace_of(pick, media)
            self.prompt_cache.store(namespace, tuple(tokens[:held]), cache, session)
        except Exception:
            log.exception("prompt cache store failed")

    # The adapters' hooks: what a request's rows select and the KV they may share.
    def namespace_of(self, pick: AdapterPick, media: str | None = None) -> CacheNamespace:
        """The prompt-cache namespace of KV computed with ``pick``'s adapters
        (and about the media of digest ``media``, :attr:`CacheNamespace.media`)."""
        namespace = self.namespace if media is None else self.namespace._replace(media=media)
        return namespace if pick.tag is None else namespace._replace(adapter=pick.tag)

    def pick(self, handle: RequestHandle, lease: bool = True) -> AdapterPick:
        """The adapters ``handle``'s request named, as slots; leased to it until
        :meth:`release` unless ``lease`` is false (work within one engine step).

        Raises:
            AdapterError: one of them was unmounted since the request was accepted.
        """
        ids = handle.request.adapter
        if self.adapters is None or not ids:
            return NO_ADAPTER
        if not lease:
            return self.adapters.pick(ids)
        return self.adapters.acquire(handle, ids)

    def release(self, handle: RequestHandle) -> None:
        """End ``handle``'s adapter lease (every request's end)."""
        if self.adapters is not None:
            self.adapters.release(handle)

    def rows(self, picks: Sequence[AdapterPick]) -> AbstractContextManager[None]:
        """A block whose model calls select ``picks[i]`` for row ``i``."""
        if self.adapters is None:
            return contextlib.nullcontext()
        return self.adapters.rows(picks)


@dataclass
class Handoff:
    """A request ready to decode: what a lane needs to continue it.

    Args:
        row (Row): the request's output bookkeeping (keeps counting across a move).
        feed (list[int]): tokens still to feed the model, at least one; the last
            one's logits give the next sampled token.
        held (list[int]): every token before ``feed`` (what ``cache`` holds), for
            the logits processors' context.
        cache (list | None): per-layer KV cache holding ``held``; ``None`` when
            ``held`` is empty.
        max_tokens (int): tokens it may still generate, at least one.
        sampler (Callable): mlx-lm sampler.
        processors (list[Callable]): mlx-lm logits processors (penalties,
            ``logit_bias``), without the grammar.
        grammar (GrammarProcessor | None): the request's grammar mask, which runs
            after ``processors``. Default: ``None``.
        shift (int): the RoPE position minus the KV index of every token from
            ``feed`` on: mRoPE's ``rope_deltas`` after a Qwen-VL prompt with media
            (:mod:`.media_prefill`); ``0`` for text. Default: ``0``.
    """

    row: Row
    feed: list[int]
    held: list[int]
    cache: list[Any] | None
    max_tokens: int
    sampler: Callable
    processors: list[Callable]
    grammar: GrammarProcessor | None = None
    shift: int = 0

    @property
    def chain(self) -> list[Callable]:
        """Every logits processor in order: the grammar mask goes last, after
        penalties and ``logit_bias``."""
        return [*self.processors, *([self.grammar] if self.grammar is not None else [])]


def start_request(handle: RequestHandle, parts: LaneParts, budget: int, lane: str) -> Handoff:
    """Start a request: the steps both lanes take before its first prefill.

    Leases the adapters it named (:meth:`LaneParts.pick`), fetches the best kept
    prefix of the prompt from the prompt cache in their namespace, builds the
    grammar for its constraint, its :class:`~.rows.Row`, its sampler and its
    logits processors (mlx-lm's ``make_sampler`` and ``make_logits_processors``,
    through :mod:`~mlxspec.engine.sampling.sampler`).

    Args:
        handle (RequestHandle): the request.
        parts (LaneParts): the engine's parts.
        budget (int): tokens it may generate (>= 1).
        lane (str): ``"serial"`` or ``"batched"``, reported in ``Finished``.

    Returns:
        Handoff: the request before any token was fed: ``held`` is the cached
        prefix (``cache`` holds it, ``None`` on a miss) and ``feed`` the rest of
        the prompt.
    """
    req = handle.request
    pick = parts.pick(handle)  # its adapters' slots, leased until it ends
    namespace = parts.namespace_of(pick)
    cache, cached = parts.prompt_cache.fetch(namespace, req.prompt, req.session)
    grammar = None if parts.grammars is None else parts.grammars.for_request(req.constraint)
    row = Row(handle, parts.tokenizer, parts.eos, lane=lane, cached=cached, grammar=grammar)
    row.pick = pick
    if parts.fills(handle):
        row.fill = FillCounts()
    elif parts.speculates(handle):
        row.spec = SpecCounts()
    return Handoff(
        row=row,
        feed=list(req.prompt[cached:]),
        held=list(req.prompt[:cached]),
        cache=cache,
        max_tokens=budget,
        sampler=build_sampler(req.sampling, list(parts.xtc_special)),
        processors=build_logits_processors(req.logits),
        grammar=grammar,
    )

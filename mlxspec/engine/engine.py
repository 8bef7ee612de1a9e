"""The engine: one thread owns MLX; handlers talk to it through an asyncio bridge.

Requests queue to a single engine thread (as mlx-lm's ``ResponseGenerator``
does). With ``max_batch > 1`` they join a continuous batch
(:class:`~.batching.BatchLane`, on mlxspec's own batched decode step,
:mod:`.decode`) between decode steps; with ``max_batch == 1`` they run alone to
their end on mlx-lm's ``generate_step`` (the serial lane). A seeded request samples from a random
stream of its own (:class:`~.sampling.SeededSampler`), so it batches like any
other (the reference; mlx_lm.server runs seeded requests alone); only a seeded
one using XTC, whose coin comes from MLX's global stream, runs serially.
In the batched lane a lone request also decodes on ``generate_step``, a token
per loop turn, and moves into the batch when another arrives (:mod:`.solo`).
Either way a
:class:`~.rows.Row` detokenizes, matches stop strings and emits :mod:`types`
events back to the request's event loop. Cancelling a handle stops it at the
next decode step. The engine thread's loop lives in :mod:`.scheduler`.
Both lanes start a request from the best prefix in :attr:`Engine.prompt_cache`
and keep its KV cache there when it ends (:mod:`.prompt_cache`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import functools
import logging
import queue
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar

from mlxspec.engine.adapters.registry import AdapterRegistry
from mlxspec.engine.caches.kv_scheme import KvOptions, KvScheme, resolve_scheme
from mlxspec.engine.caches.prompt_cache import (
    DEFAULT_PROMPT_CACHE_BYTES,
    CacheNamespace,
    PromptCache,
)
from mlxspec.engine.caches.ssd_cache import DEFAULT_SSD_CACHE_BYTES
from mlxspec.engine.distributed.group import Topology
from mlxspec.engine.distributed.serving import ShardedServing, join_group
from mlxspec.engine.distributed.shards import ShardError, apply_shard
from mlxspec.engine.distributed.watchdog import DEFAULT_TIMEOUT_S
from mlxspec.engine.embedding import Embeddings, embed_texts
from mlxspec.engine.loop.admission import Admission, AdmissionLimits
from mlxspec.engine.loop.handles import ExclusiveJob, RequestHandle
from mlxspec.engine.loop.jobs import Exclusive, Generate, Job, JobSource, Stop
from mlxspec.engine.loop.lanes import PREFILL_BATCH, LaneParts, LoopStats, default_prefill_step
from mlxspec.engine.loop.scheduler import Scheduler
from mlxspec.engine.media.encoder_cache import EncoderCache
from mlxspec.engine.media.fetch import FetchPolicy
from mlxspec.engine.media.parts import has_media
from mlxspec.engine.media.prompt import media_prompt
from mlxspec.engine.model.cpu_weights import CpuWeights, apply_cpu_weights
from mlxspec.engine.model.fit import ModelMemory, model_memory
from mlxspec.engine.model.load import LoadOptions, adapter_fingerprint, load_model
from mlxspec.engine.model.loader import read_model_info
from mlxspec.engine.model.vision import VisionWing, load_vision, vision_family
from mlxspec.engine.model.warmup import warm_up_engine
from mlxspec.engine.prompt import encode_text, normalize_messages, quiet_length_warning, render_chat
from mlxspec.engine.sampling.grammar import GrammarCache
from mlxspec.engine.sampling.sampler import GenerationDefaults, read_generation_config
from mlxspec.engine.scoring import ScoredAnswers, score_answers
from mlxspec.engine.snapshots import (
    ChatFormat,
    FitSnapshot,
    StatsSnapshot,
    read_chat_format,
    read_stats,
)
from mlxspec.engine.speculative import Speculator
from mlxspec.engine.speculative.mount import SpeculationOptions, mount
from mlxspec.engine.template_sandbox import TemplateBudget, request_template
from mlxspec.engine.text_bound import TextBound
from mlxspec.engine.types import (
    Constraint,
    EngineRequestError,
    GenerationRequest,
    GroupUnavailableError,
    ModelInfo,
    NotShardableError,
)

T = TypeVar("T")
log = logging.getLogger("mlxspec.engine")
#: The encoder-output counters of a text-only model (``/stats`` ``prompt_cache``).
EMPTY_OBJECTS = EncoderCache().stats()


#: Started engines, joined at interpreter exit: an engine thread still inside
#: MLX while C++ static destructors run can abort the process (exit 134).
_LIVE_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()


@atexit.register
def _close_live_engines() -> None:
    for engine in list(_LIVE_ENGINES):
        engine.close()


class Engine:
    """A loaded model plus the thread that runs its generations.

    Args:
        model: an ``mlx_lm`` model (``nn.Module``).
        tokenizer: an ``mlx_lm`` ``TokenizerWrapper``.
        info (ModelInfo): id, context window, start time.
        defaults (GenerationDefaults): sampling defaults for omitted fields.
        max_batch (int): most requests decoding at once; ``1`` is serial.
            Default: ``8``.
        limits (AdmissionLimits | None): wait-queue depth and operator context
            caps (:mod:`.admission`). Default: ``None`` (64 waiting, no caps).
        prompt_cache (PromptCache | None): kept KV caches for prefix reuse.
            Default: ``None`` (a RAM-only cache of the default budget).
        grammar (bool): enforce constraints (structured output); ``False``
            (``MLXSPEC_GRAMMAR=0``) reports every one as not enforced. Default: ``True``.
        prefill_step (int | None): prompt tokens per prefill chunk. Default:
            ``None`` (:func:`~.lanes.default_prefill_step`).
        warmup (bool | None): run each prefill length a prompt-cache hit can
            take once on the engine thread before the first request
            (:mod:`.warmup`); ``None`` warms when the prompt cache is on and
            buckets tails (on a GPU). Default: ``None``.
        prefill_batch (int): most prompts the batched lane prefills together
            (mlx_lm.server's ``--prompt-concurrency``). Default: :data:`PREFILL_BATCH`.
        speculator (Speculator | None): the mounted draft source
            (:mod:`.speculative`); ``None`` decodes a token per step. Default: ``None``.
        vision (VisionWing | None): mlx-vlm's model and processor for requests
            with media (:mod:`.model.vision`); ``None`` for a text-only model.
            Default: ``None``.
        group (ShardedServing | None): this rank's part of a model sharded over
            several processes (:mod:`.distributed`). Default: ``None``.
        kv (KvScheme | None): which layers keep K/V quantised
            (:mod:`.caches.kv_scheme`). Default: ``None`` (none).

    Raises:
        BudgetTooSmallError: ``limits`` leave no room for any request.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        info: ModelInfo,
        defaults: GenerationDefaults,
        max_batch: int = 8,
        limits: AdmissionLimits | None = None,
        prompt_cache: PromptCache | None = None,
        grammar: bool = True,
        prefill_step: int | None = None,
        warmup: bool | None = None,
        prefill_batch: int = PREFILL_BATCH,
        speculator: Speculator | None = None,
        vision: VisionWing | None = None,
        group: ShardedServing | None = None,
        kv: KvScheme | None = None,
    ) -> None:
        self.model = model
        #: The vision wing (requests with media), or ``None``.
        self.vision = vision
        #: How remote media URLs are fetched (``--allow-private-media``).
        self.media_policy = FetchPolicy()
        #: This rank's part in a group sharing the model (``mlx.launch``);
        #: ``None`` on one process (:mod:`.distributed`).
        self.group = group
        #: Which layers keep K/V quantised (``--kv-quant``; ``/stats`` ``kv_quant``).
        self.kv_scheme = kv if kv is not None else resolve_scheme(KvOptions(), model, None)
        #: The mounted draft source, or ``None`` (``/stats`` ``speculation``).
        self.speculator = speculator
        self.max_batch = max_batch
        self.tokenizer = tokenizer
        # Admission refuses over-long prompts; transformers' "indexing errors" line misleads.
        quiet_length_warning(tokenizer)
        self.info = info
        self.defaults = defaults
        #: Special-token strings in client text are control tokens
        #: (--allow-special-tokens-in-content; engine/literal_text.py).
        self.special_in_content = False
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._thread: threading.Thread | None = None
        self._eos = frozenset(tokenizer.eos_token_ids)
        # as mlx_lm.server's XTC special tokens
        self._xtc_special = (*tokenizer.encode("\n"), *sorted(self._eos))
        self._prefill_step = default_prefill_step() if prefill_step is None else prefill_step
        self._prefill_batch = prefill_batch
        self.grammars = GrammarCache(tokenizer, info.vocab_size, set(self._eos), enabled=grammar)
        #: What the engine loop counts (outcomes, handoffs, step times).
        self.loop_stats = LoopStats()
        #: Requests by outcome, updated on the engine thread (read for /stats and tests).
        self.counters = self.loop_stats.outcomes
        #: Requests accepted by :meth:`submit` (each ends in one of ``counters``).
        self.submitted = 0
        #: Batched-lane step times since start (``GET /stats`` ``batch.steps``).
        self.step_times = self.loop_stats.steps
        #: Decode steps of requests running alone (``batch.solo_steps``).
        self.solo_times = self.loop_stats.solo_steps
        #: Whether :meth:`load` made the weights float32 for the CPU BLAS.
        self.cpu_weights: CpuWeights | None = None
        limits = limits or AdmissionLimits()
        budgets = (limits.memory_budget, limits.kv_budget)
        memory = self.memory if budgets != (None, None) else None
        self.admission = Admission(limits, max_batch, info.context_window, memory)
        self._text_bound = TextBound(
            tokenizer, self.admission.context_limit, self.admission.context_words()
        )
        #: Every generation's KV projection from submission to its end (:mod:`.kv_ledger`).
        self.kv = self.admission.kv
        #: Requests in line for a decode slot under a byte budget (engine thread).
        self.kv_gate = self.kv.line
        #: Prefix KV reuse across requests (``stats()`` feeds ``GET /stats``).
        self.prompt_cache = prompt_cache if prompt_cache is not None else PromptCache()
        #: Everything that changes KV numbers: the model and its weights (a request's
        #: adapters add their digests at its start: ``LaneParts.namespace_of``).
        self.cache_namespace = CacheNamespace(
            info.id, kv_quant=self.kv_scheme.tag, weights=info.weights
        )
        #: The LoRA adapters mounted on the model (:mod:`.adapters`); mount and
        #: unmount through :meth:`run_exclusive`, so no forward pass runs meanwhile.
        self.adapters = AdapterRegistry(model, info.id)
        #: Whether :meth:`start` warms the prefill lengths before serving.
        self.warmup = (
            self.prompt_cache.enabled and self.prompt_cache.bucket_tails
            if warmup is None
            else warmup
        )

    @property
    def lane_parts(self) -> LaneParts:
        """What the lanes run requests with, from the engine's current prompt cache
        (the engine thread takes it once, when it starts)."""
        return LaneParts(
            self.model,
            self.tokenizer,
            self._eos,
            self._xtc_special,
            self._prefill_step,
            self.prompt_cache,
            self.cache_namespace,
            self.grammars,
            prefill_batch=self._prefill_batch,
            adapters=self.adapters,
            speculator=self.speculator,
            vision=self.vision,
            kv=self.kv_scheme,
        )

    @property
    def handoffs(self) -> int:
        """Lone requests moved into the batch mid-request (:mod:`.solo`)."""
        return self.loop_stats.handoffs

    @functools.cached_property
    def memory(self) -> ModelMemory:
        """The model's weight bytes and per-token KV cache bytes (:mod:`.fit`); a
        vision model's weights count its towers (and any unshared language copy)."""
        memory = model_memory(self.model)
        if self.vision is not None:
            extra = memory.weights_bytes + self.vision.extra_bytes()
            memory = dataclasses.replace(memory, weights_bytes=extra)
        return self.kv_scheme.applied(memory)

    @classmethod
    def load(
        cls,
        path: Path,
        model_id: str,
        *,
        source: str = "local",
        overrides: GenerationDefaults | None = None,
        max_batch: int = 8,
        limits: AdmissionLimits | None = None,
        prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES,
        ssd_cache: Path | None = None,
        ssd_cache_bytes: int = DEFAULT_SSD_CACHE_BYTES,
        grammar: bool = True,
        cpu_weights: str = "auto",
        warmup: bool | None = None,
        load_options: LoadOptions | None = None,
        prefill_step: int | None = None,
        prefill_batch: int = PREFILL_BATCH,
        prompt_cache_entries: int | None = None,
        speculation: SpeculationOptions | None = None,
        topology: Topology | None = None,
        group_timeout: float = DEFAULT_TIMEOUT_S,
        kv: KvOptions | None = None,
        fill: bool = False,
    ) -> Engine:
        """Load an MLX model folder with ``mlx_lm.load``.

        Args:
            path (Path): folder with config.json, safetensors and tokenizer files.
            model_id (str): the id responses echo.
            source (str): where the folder came from. Default: ``"local"``.
            overrides (GenerationDefaults | None): server CLI sampling flags,
                which win over ``generation_config.json``. Default: ``None``.
            max_batch (int): concurrency cap; ``1`` is serial. Default: ``8``.
            limits (AdmissionLimits | None): admission limits. Default: ``None``.
            prompt_cache_bytes (int): prompt cache RAM budget; ``0`` disables
                it. Default: :data:`~.prompt_cache.DEFAULT_PROMPT_CACHE_BYTES`.
            ssd_cache (Path | None): directory of the SSD tier. Default: ``None``.
            ssd_cache_bytes (int): disk budget of the SSD tier.
                Default: :data:`~.ssd_cache.DEFAULT_SSD_CACHE_BYTES`.
            grammar (bool): enforce constraints. Default: ``True``.
            cpu_weights (str): float32 weights on the CPU
                (:func:`~.cpu_weights.apply_cpu_weights`). Default: ``"auto"``.
            warmup (bool | None): warm the prefill lengths at start (see
                :class:`Engine`). Default: ``None`` (when tails are bucketed).
            load_options (LoadOptions | None): adapter and tokenizer options
                (:func:`~.model.load.load_model`). Default: ``None``.
            prefill_step (int | None): prompt tokens per prefill chunk. Default:
                ``None`` (:func:`~.lanes.default_prefill_step`).
            prefill_batch (int): most prompts the batch prefills together.
                Default: :data:`PREFILL_BATCH`.
            prompt_cache_entries (int | None): most KV caches the prompt cache
                keeps; ``None`` bounds only the bytes. Default: ``None``.
            speculation (SpeculationOptions | None): the draft source to mount
                (``--draft-model``, ``--draft-kind``). Default: ``None``.
            topology (Topology | None): load only this rank's shard of a model
                sharded over a process group (``mlx.launch``); every rank calls
                this at once. Default: ``None`` (the whole model).
            group_timeout (float): seconds the group may stall before it is given
                up (:mod:`.distributed.watchdog`). Default: 60.
            kv (KvOptions | None): KV quantisation (``--kv-quant``, ``--kv-bits``).
                Default: ``None`` (full precision).
            fill (bool): feed requests with a grammar the text it forces
                through the batch's verify step (``--fill strict``,
                :mod:`.speculative.fill`). Default: ``False``.

        Returns:
            Engine: not yet started; call :meth:`start` (``engine.cpu_weights``
            says whether the weights were converted).

        Raises:
            ValueError: ``cpu_weights`` is not a known mode.
            SpeculationError: ``speculation`` cannot be mounted (names the flag).
            ShardError: the model cannot be split over ``topology``.
            KvQuantError: ``kv`` does not fit the model (names the flag).
        """
        options = load_options or LoadOptions()
        # a VLM without the vision extra fails before any weight loads
        family = vision_family(Path(path))
        if topology is not None and family is not None:
            raise ShardError(
                f"{family} is a vision-language model: sharding one over processes is not supported"
            )
        if topology is not None:
            options = dataclasses.replace(
                options, shard=functools.partial(apply_shard, topology=topology)
            )
        model, tokenizer = load_model(Path(path), options)
        converted = apply_cpu_weights(model, cpu_weights)
        vision = load_vision(Path(path), model)  # after the conversion: it shares the weights
        info = read_model_info(Path(path), model_id, model, tokenizer, source)
        scheme = resolve_scheme(kv or KvOptions(), model, Path(path))
        if vision is not None:
            info = dataclasses.replace(info, media=vision.media)
        if converted.float32:  # float32 activations give other KV numbers
            info = dataclasses.replace(info, weights=f"{info.weights}+float32")
        if (adapter := adapter_fingerprint(options.adapter_path)) is not None:
            info = dataclasses.replace(info, weights=f"{info.weights}+adapter:{adapter}")
        defaults = read_generation_config(Path(path)).merged(
            **(overrides or GenerationDefaults()).__dict__
        )
        cache = PromptCache.tiered(
            prompt_cache_bytes, ssd_cache, ssd_cache_bytes, prompt_cache_entries
        )
        group = None if topology is None else join_group(topology, model, cache, group_timeout)
        engine = cls(
            model,
            tokenizer,
            info,
            defaults,
            max_batch=max_batch,
            limits=limits,
            prompt_cache=cache,
            grammar=grammar,
            prefill_step=prefill_step,
            warmup=warmup,
            prefill_batch=prefill_batch,
            speculator=mount(speculation, model, tokenizer, fill),
            vision=vision,
            group=group,
            kv=scheme,
        )
        engine.cpu_weights = converted
        return engine

    def start(self) -> None:
        """Start the engine thread (idempotent); with :attr:`warmup` it warms
        the prefill lengths first while submitted requests wait in its queue."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="mlxspec-engine", daemon=True)
            self._thread.start()
            _LIVE_ENGINES.add(self)

    def wait(self) -> None:
        """Block until the engine thread ends (a follower rank's main thread)."""
        if self._thread is not None:
            self._thread.join()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the engine thread after the current request."""
        if self._thread is not None:
            self._jobs.put(Stop())
            self._thread.join(timeout)
            self._thread = None
        if self.group is not None:
            self.group.stop()
        _LIVE_ENGINES.discard(self)

    # Prompt building (runs on the caller's thread; no MLX work).
    def chat_prompt(
        self,
        messages: list,
        tools: list | None = None,
        template_kwargs: dict | None = None,
        budget: TemplateBudget | None = None,
    ) -> list[int]:
        """Template and tokenize chat messages (:func:`~.prompt.render_chat`;
        ``budget`` bounds a template the request brings). Raises ``PromptError``.

        On a vision model, messages with media go to :func:`.media_prompt.media_prompt`
        (a :class:`~.types.MediaPrompt`)."""
        if self.vision is not None and has_media(messages):
            return media_prompt(
                self.vision, self.tokenizer, self.info.id, self.media_policy,
                messages, tools, template_kwargs, budget, self._text_bound,
            )  # fmt: skip
        normalized = normalize_messages(messages, self.info.id)
        return render_chat(
            self.tokenizer, normalized, tools=tools, template_kwargs=template_kwargs,
            budget=budget, bound=self._text_bound, special_in_content=self.special_in_content,
        )  # fmt: skip

    def text_prompt(self, prompt: str) -> list[int]:
        """Tokenize a raw completion prompt (no template)."""
        return encode_text(self.tokenizer, prompt, self._text_bound)

    def check_fits(self, prompt_tokens: int, param: str = "messages") -> None:
        """Raise ``ContextLengthError`` unless the prompt leaves room for one token.

        Args:
            prompt_tokens (int): prompt length in tokens.
            param (str): the request field named in the error. Default: ``"messages"``.
        """
        self.admission.check_window(prompt_tokens, param)

    def grammar_problem(self, constraint: Constraint) -> str | None:
        """Compile ``constraint`` into the grammar cache ahead of :meth:`submit`.

        Thread-safe; a first compile can take a while, so call it off the event loop.

        Returns:
            str | None: ``None`` if the constraint will be enforced, else why not
            (the handler's degrade path puts it in the ``Warning`` header).
        """
        return self.grammars.problem(constraint)

    @property
    def running_kv_tokens(self) -> int:
        """Tokens of KV cache the running requests project together (``batch.kv_bytes``)."""
        return self.kv.running_tokens

    @property
    def in_flight(self) -> int:
        """Requests submitted and not yet ended (running or waiting)."""
        ended = self.counters["completed"] + self.counters["cancelled"] + self.counters["failed"]
        return self.submitted - ended + self.admission.held  # decisions, embeddings

    def submit(
        self,
        request: GenerationRequest,
        prompt_param: str = "messages",
        *,
        group: int = 1,
        admitted: bool = False,
    ) -> RequestHandle:
        """Queue ``request``; iterate the returned handle for its events.

        Must be called from a running asyncio event loop.

        Args:
            request (GenerationRequest): the job.
            prompt_param (str): the request field holding the prompt, named in
                errors. Default: ``"messages"``.
            group (int): ``request`` heads this many requests admitted all or
                none (a body's ``n`` choices); the others follow in the same
                event-loop turn with ``admitted=True``. Default: ``1``.
            admitted (bool): a later member of a group its head admitted; the
                queue checks are skipped. Default: ``False``.

        Raises:
            ContextLengthError: the prompt does not fit the context window.
            ContextBudgetError: it leaves no room under the operator's cap.
            EngineRequestError: ``group`` is more than the server ever holds (``n``),
                or a request with media names LoRA adapters.
            QueueFullError: the wait queue has no room for ``group`` more requests.
        """
        if self.group is not None and self.group.failure is not None:
            raise GroupUnavailableError(self.group.failure)
        self.check_fits(len(request.prompt), prompt_param)
        if request.media is not None and request.adapter:  # the vision wing has no LoRA hook
            raise EngineRequestError(
                "LoRA adapters do not apply to requests with media yet", "adapter"
            )
        budget = self.budget(request)
        if not admitted:
            projected = len(request.prompt) + budget
            self.admission.admit(
                len(request.prompt), self.in_flight, prompt_param, projected, count=group
            )
        handle = RequestHandle(request, asyncio.get_running_loop(), agreed=self.group is not None)
        job = Generate(handle, budget)
        self.submitted += 1
        self.kv.submit(job)  # before the engine thread can take it off the queue
        self._jobs.put(job)
        return job.handle

    async def run_exclusive(self, fn: Callable[[], T]) -> T:
        """Run ``fn()`` on the engine thread between decode steps; await its result.

        For MLX work outside generation (decision scoring, embeddings): the one
        thread that owns MLX runs it, in queue order with the other exclusive
        jobs. A plain ``fn`` runs whole while the batch waits; one that returns
        a generator is stepped, a step per engine-loop turn beside the running
        requests' decode steps, and its return value is the result
        (:class:`~.handles.ExclusiveJob`). Cancelling the awaiting task before
        ``fn`` starts skips it; a stepped job is closed at its next step; a
        plain one runs to the end and its result is dropped.

        Args:
            fn (Callable[[], T]): the work; no arguments.

        Returns:
            T: what ``fn`` returned (for a generator, its return value).

        Raises:
            Exception: whatever ``fn`` raised, re-raised in the caller.
        """
        if self.group is not None:  # MLX work on rank 0 alone would desert the group
            size = self.group.info.world_size
            raise NotShardableError(f"not available with the model sharded over {size} processes")
        job = ExclusiveJob(fn)
        self._jobs.put(Exclusive(job))
        try:
            return await asyncio.wrap_future(job.future)
        except asyncio.CancelledError:
            job.left.set()
            raise

    # What handlers ask beyond prompts and work (:class:`~.interface.EngineProtocol`):
    # plain answers in place of the admission, counters, memory, tokenizer and caches.
    @functools.cached_property
    def chat_format(self) -> ChatFormat:
        """The tokenizer's chat template text, inferred tool parser and thinking marker."""
        return read_chat_format(self.tokenizer)

    def request_template(self, template_kwargs: Mapping[str, Any] | None) -> Any:
        """The template ``chat_template_kwargs`` bring, or ``None``
        (:func:`~.template_sandbox.request_template`)."""
        return request_template(self.tokenizer, template_kwargs)

    def decode_tokens(self, ids: Sequence[int]) -> str:
        """The text of token ids of the served model (special tokens kept)."""
        return self.tokenizer.decode(list(ids))

    def count_text_tokens(self, text: str) -> int:
        """Tokens ``text`` encodes to, without special tokens (usage counts)."""
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def hold(self, job: str) -> AbstractContextManager[None]:
        """A place in the admission queue for work that generates nothing, for a
        ``with`` block (:meth:`Admission.hold`). Raises ``QueueFullError`` naming ``job``."""
        return self.admission.hold(self.in_flight, job)

    async def score(self, messages: list[dict], answers: Sequence[str]) -> ScoredAnswers:
        """Score ``answers`` as the reply to ``messages`` (:func:`~.scoring.score_answers`)."""
        return await score_answers(self, messages, answers)

    async def embed(
        self,
        texts: Sequence[str | Sequence[int]],
        instruction: str | None,
        dimensions: int | None = None,
    ) -> Embeddings:
        """Embed ``texts`` with the served model (:func:`~.embedding.embed_texts`)."""
        return await embed_texts(self, texts, instruction, dimensions)

    def stats_snapshot(self) -> StatsSnapshot:
        """Request counters, admission and batch state now (:func:`~.snapshots.read_stats`)."""
        return read_stats(self)

    def fit_snapshot(self) -> FitSnapshot:
        """The model's memory facts and the operator's limits."""
        adm = self.admission
        memory = self.memory
        kv_quant = self.kv_scheme.describe(memory.kv_dtype, memory.kv_bytes_per_token)
        return FitSnapshot(memory, adm.limits.memory_budget, adm.context_limit, kv_quant)

    def distributed_block(self) -> dict[str, Any] | None:
        """``/stats`` and ``/fit``'s ``distributed`` block (world size, backend,
        each rank's weight bytes); ``None`` on one process."""
        return None if self.group is None else self.group.block()

    def cache_stats(self) -> dict[str, dict[str, Any]]:
        """``prompt_cache`` (and ``ssd_cache`` with an SSD tier) counters, by section."""
        objects = self.vision.encoder_cache.stats() if self.vision is not None else {}
        sections = {"prompt_cache": self.prompt_cache.stats() | (objects or EMPTY_OBJECTS)}
        if self.prompt_cache.ssd is not None:
            sections["ssd_cache"] = self.prompt_cache.ssd.stats()
        return sections

    def close_cache_session(self, session: str) -> None:
        """Forget ``session``'s checkpoint association; its entries stay cached."""
        self.prompt_cache.close_session(session)

    def flush_cache(self, timeout: float) -> dict[str, Any]:
        """Write every pending SSD snapshot, blocking up to ``timeout`` seconds
        (:meth:`PromptCache.flush`); the report says whether all are ``durable``."""
        return self.prompt_cache.flush(timeout)

    def drain(self, timeout: float) -> int:
        """Quiesce, then demote the prompt cache to the SSD tier (a worker's
        ``POST /admin/drain``, before its supervisor stops it). Blocks.

        Waits until no request is in flight (new ones are still admitted: the
        supervisor stops routing to a draining worker first), then
        :meth:`PromptCache.demote`, both within ``timeout`` seconds.

        Args:
            timeout (float): most seconds for both steps together.

        Returns:
            int: prompt-cache entries demoted from RAM to the SSD tier.
        """
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.prompt_cache.demote(max(0.0, deadline - time.monotonic()))

    # Engine thread.
    def _run(self) -> None:
        if self.warmup:
            warm_up_engine(self.model, self.info.context_window, self._prefill_step, self.max_batch)
        # The loop gets only what it runs with, never the engine itself.
        jobs: queue.Queue[Job] | JobSource = self._jobs
        if self.group is not None:  # the seam: every rank runs rank 0's step plans
            jobs = self.group.job_source(self._jobs, self.kv.submit)
        try:
            with self.group.stream() if self.group is not None else contextlib.nullcontext():
                Scheduler(jobs, self.lane_parts, self.kv, self.loop_stats, self.max_batch).run()
        except Exception as exc:
            if self.group is None or self.group.failure is None:
                raise
            log.error("engine loop ended: %s", exc)

    def budget(self, req: GenerationRequest) -> int:
        """Tokens ``req`` may generate: its ``max_tokens`` capped by the room left
        in the context window or under the operator's cap (:meth:`Admission.room`)."""
        return self.admission.room(len(req.prompt), req.max_tokens)

"""Server configuration, parsed once at the edge into a frozen dataclass."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mlxspec.engine import (
    DEFAULT_PROMPT_CACHE_BYTES,
    DEFAULT_SSD_CACHE_BYTES,
    DEFAULT_TEMPLATE_SECONDS,
    DEFAULT_TEMPLATE_STEPS,
)


@dataclass(frozen=True)
class ServeConfig:
    """Everything ``mlxspec serve`` was started with.

    Args:
        model (str | None): model folder, Hugging Face repo id, ``.gguf`` file,
            or ``None`` for the embedded default. Default: ``None``.
        host (str): bind address. Default: ``"127.0.0.1"``.
        port (int): TCP port. Default: ``8080``.
        max_tokens (int | None): default completion cap when a request sets
            none; ``None`` generates until EOS or the context is full. Default: ``None``.
        temperature (float | None): default temperature (overrides the model's
            generation_config.json). Default: ``None``.
        top_p (float | None): default top_p. Default: ``None``.
        top_k (int | None): default top_k. Default: ``None``.
        log_level (str): Python logging level name. Default: ``"info"``.
        batch (int): most requests decoding at once (continuous batching);
            ``1`` runs requests one at a time. Default: ``8``.
        validate_responses (bool): check every JSON response against the
            OpenAPI document (for tests and CI). Default: ``False``.
        max_queue (int): most requests waiting for a decode slot; the next
            gets 429 ``queue_full``. Default: ``64``.
        max_context (int | None): operator cap on prompt + completion tokens
            per request. Default: ``None``.
        memory_budget (int | None): bytes the model may use (weights + KV
            cache); caps each request's context and the running requests' KV
            cache together. Default: ``None``.
        kv_budget (int | None): bytes of KV cache the running requests may
            project together (prompt + generation budget each); requests
            beyond it wait for a slot. Default: ``None``.
        api_key (str | None): when set, every route but ``/health`` and the
            document needs ``Authorization: Bearer`` or ``x-api-key`` with it.
            Kept out of ``repr``. Default: ``None``.
        max_body_bytes (int): largest request body; a larger one is answered
            413 before anything parses it. Default: 16 MiB.
        allowed_origins (tuple[str, ...]): CORS origins (``"*"`` for any);
            empty turns CORS off; they may also call ``/admin/*``. Default: ``()``.
        allowed_hosts (tuple[str, ...]): ``Host`` names answered besides
            ``localhost``, ``127.0.0.1``, ``[::1]`` and ``host`` (``"*"`` for
            any); checked when ``host`` is a loopback address, or when any are
            given (:mod:`mlxspec.http.guard`). Default: ``()``.
        header_timeout (float): seconds a request line and headers may take
            to arrive (:mod:`mlxspec.http.connections`). Default: ``30.0``.
        keep_alive_timeout (float): seconds an idle kept-alive connection
            stays open. Default: ``30.0``.
        max_header_bytes (int): most bytes of request target and headers; more
            is a 431. Default: 64 KiB.
        max_connections (int): most connections open at once; the next gets a
            503; ``0`` for no cap. Default: ``1000``.
        prompt_cache_bytes (int): RAM budget of the prompt cache (prefix KV
            reuse); ``0`` disables it. Default: 1 GiB.
        ssd_cache (str | None): directory of the prompt cache's SSD tier;
            ``None`` is RAM only. Default: ``None``.
        ssd_cache_bytes (int): disk budget of the SSD tier. Default: 16 GiB.
        logprobs_format (str): ``"mlx"`` for mlx_lm.server's logprobs block
            (parity), ``"openai"`` for OpenAI's shapes (``token``/``bytes``,
            ``top_logprobs`` up to 20, logprobs in stream chunks). Default: ``"mlx"``.
        grammar (bool): enforce structured output with xgrammar; ``False``
            (environment ``MLXSPEC_GRAMMAR=0``) answers every constraint with the
            degrade path. Default: ``True``.
        cpu_weights (str): ``auto``, ``float32`` or ``native``: whether the CPU
            backend holds the weights as float32 for the optimised BLAS
            (:mod:`mlxspec.engine.model.cpu_weights`). Default: ``"auto"``.
        web_tools (str | None): the web chat's coding tools' workspace
            (``--web-tools``); ``None``: the tools are off. Default: ``None``.
        web_tool_steps (int): model steps one web chat turn may take while it
            calls tools (``--web-tool-steps``). Default: ``8``.
        web_tool_timeout (float): seconds one tool call may run
            (``--web-tool-timeout``). Default: ``120``.
        web_tool_output (int): bytes of output one tool call keeps. Default: 64 KiB.
        mcp_config (str | None): an ``mcpServers`` JSON file whose stdio servers'
            tools the web chat offers, each call approved (``--mcp-config``).
            Default: ``None``.
        chat_db (str | None): the web chat's sessions database (SQLite);
            ``None`` is ``chat.sqlite3`` in mlxspec's cache folder
            (:func:`mlxspec.http.ws_chat.chat_db_path`). Default: ``None``.
        warmup (bool | None): run each prefill length a prompt-cache hit can
            take once before serving (:mod:`mlxspec.engine.model.warmup`); environment
            ``MLXSPEC_WARMUP``: ``0`` off, ``1`` on, unset or ``auto`` (``None``)
            when the prompt cache buckets tails (on a GPU). Default: ``None``.
        allow_request_templates (bool): a request may bring its own chat
            template (``chat_template_kwargs.chat_template``), rendered within
            the two bounds below; without it such a request is a 400 (vLLM's
            ``--trust-request-chat-template``). Default: ``False``.
        allow_private_media (bool): remote media URLs may point at private,
            loopback and link-local hosts (``--allow-private-media``, environment
            ``MLXSPEC_ALLOW_PRIVATE_MEDIA=1``); by default they are refused
            (:mod:`mlxspec.engine.media.fetch`). Default: ``False``.
        allow_special_tokens_in_content (bool): special-token strings in
            client text (message contents, tool arguments and results) are
            control tokens, as mlx_lm.server reads them; by default they are
            text (:mod:`mlxspec.engine.literal_text`). Default: ``False``.
        stream_usage (str): ``"requested"``: a chat or text completion stream
            carries ``usage`` only in the extra final chunk
            ``stream_options.include_usage`` asks for (OpenAI's contract);
            ``"always"``: also on the chunk that finishes the last choice when
            not asked (the reference's always-on superset). Default: ``"requested"``.
        request_template_steps (int): most steps (loop iterations, calls,
            filters, operators, output pieces) one render of a request's
            template may take (:mod:`mlxspec.engine.template_sandbox`).
            Default: ``100000``.
        request_template_seconds (float): most seconds one render of a
            request's template may take. Default: ``2.0``.
        adapter_path (str | None): an adapter folder (``--adapter-path``,
            mlx_lm.server's spelling): a LoRA one is mounted at start-up as the
            default adapter of requests that name none (hot-swappable over
            ``/v1/adapters``); a DoRA or full fine-tune is applied at load, as
            mlx_lm.server does. Default: ``None``.
        adapter_dirs (tuple[str, ...]): the directories ``POST /v1/adapters``
            may read adapters from; ``()`` allows any path the server can read.
            ``GET /v1/adapters/available`` lists the adapter folders in them too.
        max_adapters (int): LoRA adapters mounted at once (``--max-adapters``);
            a mount past it is a 429 ``too_many_adapters``. Default: 32.
        max_adapter_stack (int): adapters one request may stack
            (``--max-adapter-stack``); more is a 400 ``adapter_stack_too_deep``.
            Default: 8.
            Default: ``()``.
        trust_remote_code (bool): let the tokenizer run the model's code. Default: ``False``.
        chat_template (str | None): a chat template replacing the model's. Default: ``None``.
        use_default_chat_template (bool): the tokenizer class's default template
            when the model has none. Default: ``False``.
        min_p (float | None): default min_p. Default: ``None`` (off).
        chat_template_args (Mapping): template variables every request starts
            from (mlx_lm.server's ``--chat-template-args``). Default: ``{}``.
        thinking (bool | None): default ``enable_thinking`` of every prompt
            (``--thinking on|off``); ``None`` leaves it to the template. Default: ``None``.
        prefill_step (int | None): prompt tokens per prefill chunk; ``None``
            is 128 on the CPU, 512 on a GPU. Default: ``None``.
        prompt_concurrency (int): most prompts prefilled together. Default: ``8``.
        prompt_cache_size (int | None): most prompt-cache entries; ``None`` bounds
            only the bytes. Default: ``None``.
        draft_model (str | None): the draft model of speculative decoding
            (``--draft-model``). Default: ``None``.
        draft_kind (str | None): ``"model"`` (with ``draft_model``) or
            ``"ngram"`` (prompt lookup, no model); ``None``: no speculation.
            Default: ``None``.
        num_draft_tokens (int): most drafts per row and step. Default: ``3``.
        fill (str): token fast-forwarding, ``"off"`` or ``"strict"`` (``--fill``,
            ``MLXSPEC_FILL``). Default: ``"off"``.
        pipeline (bool): under ``mlx.launch``, split the model's layers across
            the processes instead of each layer's heads (``--pipeline``).
            Default: ``False``.
        kv_quant (str): ``"bf16"`` (none), ``"kv8"``, ``"kv4"`` or ``"config"``
            (per layer from ``kv_config.json``): ``--kv-quant`` or ``--kv-bits``.
            Default: ``"bf16"``.
        kv_group_size (int): elements per scale of quantised K/V
            (``--kv-group-size``). Default: ``64``.
        quantized_kv_start (int): tokens a layer holds before it is quantised
            (``--quantized-kv-start``). Default: ``0``.
        kv_config (str | None): the ``kv_config.json`` of ``kv_quant="config"``
            (``--kv-config``); ``None``: the model folder's. Default: ``None``.
        whisper_model (str | None): the Whisper checkpoint of ``/v1/audio/*``
            (:func:`mlxspec.engine.audio.resolve_whisper`); ``None`` picks the
            installed default. Default: ``None``.
        whisper_idle_unload (float): seconds after the last take before the
            Whisper weights are released. Default: ``300``.
        whisper_resident (bool): never release them. Default: ``False``.
        whisper_nice (int): the CPU niceness of the Whisper worker process
            beside a chat model, 0 to 19. Default: ``19`` (the lowest).
        max_audio_seconds (float | None): longest take; longer is a 413. Default: ``3600``.
        audio_session_idle (float): seconds a dictation session may go without a
            request before it is discarded; ``0`` never. Default: ``300``.
        unix (str | None): serve on this unix socket (mode 0600) instead of TCP,
            with the worker routes ``/admin/drain`` and ``/admin/lease`` (an
            ``--isolate`` child). Default: ``None``.
        isolate (bool): run the engine in a child process behind a proxy
            (:mod:`mlxspec.supervisor`). Default: ``False``.
        model_pool (tuple[str, ...]): more models served under ``isolate``, one
            child each, picked by the body's ``model``. Default: ``()``.
        pool_max_resident (int | None): most children resident at once; the
            least recently used idle one is stopped first. Default: ``None``.
        pool_idle_unload (float | None): seconds a child may sit idle before it
            is stopped; ``None`` never. Default: ``None``.
        pool_pin (tuple[str, ...]): model ids never evicted nor unloaded. Default: ``()``.
        pool_start_timeout (float): seconds a child may take to answer
            ``/health`` before it is killed. Default: ``600``.
        strict_model (bool): a ``model`` that names nothing served is a 404
            ``model_not_found``. Default: ``False`` (ignored, the served model answers).
        response_store (str | None): the ``--isolate`` parent's Responses store
            socket; set by the parent for its children, no flag. Default: ``None``
            (the process keeps its own store).
        response_store_key (str | None): that socket's hex handshake key. Default: ``None``.
        jobs_roots (tuple[str, ...]): ``--jobs`` folders: when any are given, the
            jobs routes (``/api/jobs``, ``/api/finetune/*``, ``/api/quantize/*``,
            ``/api/dataset/*``) are served, and job paths may lie in them (besides
            mlxspec's cache and the HF hub cache). Default: ``()`` (jobs off).
    """

    model: str | None = None
    host: str = "127.0.0.1"
    port: int = 8080
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    log_level: str = "info"
    batch: int = 8
    validate_responses: bool = False
    max_queue: int = 64
    max_context: int | None = None
    memory_budget: int | None = None
    kv_budget: int | None = None
    api_key: str | None = field(default=None, repr=False)
    allowed_origins: tuple[str, ...] = ()
    max_body_bytes: int = 16 * 2**20
    # HTTP edge: Host/Origin checks and connection limits.
    allowed_hosts: tuple[str, ...] = ()
    header_timeout: float = 30.0
    keep_alive_timeout: float = 30.0
    max_header_bytes: int = 64 * 2**10
    max_connections: int = 1000
    # Prompt cache.
    prompt_cache_bytes: int = DEFAULT_PROMPT_CACHE_BYTES
    ssd_cache: str | None = None
    ssd_cache_bytes: int = DEFAULT_SSD_CACHE_BYTES
    logprobs_format: str = "mlx"
    grammar: bool = True
    cpu_weights: str = "auto"
    warmup: bool | None = None
    # Chat templates from requests.
    allow_request_templates: bool = False
    request_template_steps: int = DEFAULT_TEMPLATE_STEPS
    request_template_seconds: float = DEFAULT_TEMPLATE_SECONDS
    # What reaches the prompt, and usage in streams.
    allow_private_media: bool = False
    allow_special_tokens_in_content: bool = False
    stream_usage: str = "requested"
    # mlx_lm.server's loading, templating and batching flags.
    adapter_path: str | None = None
    trust_remote_code: bool = False
    chat_template: str | None = None
    use_default_chat_template: bool = False
    min_p: float | None = None
    chat_template_args: Mapping[str, Any] = field(default_factory=dict, hash=False)
    thinking: bool | None = None
    prefill_step: int | None = None
    prompt_concurrency: int = 8
    prompt_cache_size: int | None = None
    # Speculative decoding (engine/speculative/): --draft-model, --draft-kind.
    draft_model: str | None = None
    draft_kind: str | None = None
    num_draft_tokens: int = 3
    fill: str = "off"  # --fill / MLXSPEC_FILL: "off" or "strict"
    # Under mlx.launch: split layers, not heads, across the processes (engine/distributed/).
    pipeline: bool = False
    # KV cache quantisation (engine/caches/kv_scheme.py): --kv-quant, --kv-bits.
    kv_quant: str = "bf16"
    kv_group_size: int = 64
    quantized_kv_start: int = 0
    kv_config: str | None = None
    # The web chat's sessions database (--chat-db); None: ~/.cache/mlxspec/.
    chat_db: str | None = None
    # The web chat's coding tools (--web-tools): their workspace, None: off;
    # model steps one turn may take, seconds and output bytes one call may use.
    web_tools: str | None = None
    web_tool_steps: int = 8
    web_tool_timeout: float = 120.0
    web_tool_output: int = 64 * 1024
    # MCP stdio servers whose tools the web chat offers (--mcp-config).
    mcp_config: str | None = None
    # Speech to text.
    whisper_model: str | None = None
    whisper_idle_unload: float = 300.0
    whisper_resident: bool = False
    whisper_nice: int = 19
    max_audio_seconds: float | None = 3600.0
    audio_session_idle: float = 300.0
    # Where POST /v1/adapters may read LoRA adapters from.
    adapter_dirs: tuple[str, ...] = ()
    # LoRA adapters mounted at once, and stacked in one request.
    max_adapters: int = 32
    max_adapter_stack: int = 8
    # The supervisor (mlxspec/supervisor/): worker mode and the isolated parent.
    unix: str | None = None
    isolate: bool = False
    model_pool: tuple[str, ...] = ()
    pool_max_resident: int | None = None
    pool_idle_unload: float | None = None
    pool_pin: tuple[str, ...] = ()
    pool_start_timeout: float = 600.0
    strict_model: bool = False
    # Set by the --isolate parent for its children only (no flag): its store.
    response_store: str | None = None
    response_store_key: str | None = None
    # Fine-tune, quantize and dataset jobs (mlxspec/jobs/): --jobs ROOT, off when empty.
    jobs_roots: tuple[str, ...] = ()

    @property
    def template_defaults(self) -> dict[str, Any]:
        """The chat template variables requests start from: ``chat_template_args``,
        with ``enable_thinking`` set by ``thinking`` when it is not ``None``."""
        variables = dict(self.chat_template_args)
        if self.thinking is not None:
            variables["enable_thinking"] = self.thinking
        return variables


SERVE_ENV_DEFAULTS = {"MLX_CUDA_USE_CUDNN_SDPA": "0"}
"""Environment defaults of ``mlxspec serve`` (a value the user set wins).

``MLX_CUDA_USE_CUDNN_SDPA=0``: mlx-cuda's cuDNN attention builds a graph per
query *and* key length (and batch shape), so a server, whose prompts and batches
have new shapes all the time, pays the plan again and again. Without it, on the
H200 in one machine start (``benchmarks/README.md``, "cuDNN attention off for
serving"), the 1.2B model streamed 384-434 tok/s against 283 at concurrency 1,
and the 7.4B 199 against 106 at 1 and 552 against 491 at 8 (TTFT 0.33 against
1.09 s). No effect off CUDA.
"""


def apply_serve_env_defaults(environ: dict[str, str] | None = None) -> None:
    """Set :data:`SERVE_ENV_DEFAULTS` in ``environ`` (``os.environ``) where unset.

    Must run before MLX reads them (the model load), as ``mlxspec.cli.main.main`` does.
    """
    environ = os.environ if environ is None else environ
    for key, value in SERVE_ENV_DEFAULTS.items():
        environ.setdefault(key, value)

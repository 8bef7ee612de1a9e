"""The ``mlxspec serve`` flags: the argument parser, its value types, and
:func:`parse_config`, which turns a command line (and the ``MLXSPEC_*``
environment variables it reads) into a :class:`~.config.ServeConfig`."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence

from mlxspec import __version__
from mlxspec.cli.argtypes import existing_folder as _existing_folder
from mlxspec.cli.argtypes import non_negative_int as _non_negative_int
from mlxspec.cli.argtypes import positive_float as _positive_float
from mlxspec.cli.argtypes import positive_int as _positive_int
from mlxspec.cli.audio_flags import add_audio_flags, audio_config
from mlxspec.cli.jobs_flags import add_jobs_flags, jobs_config
from mlxspec.cli.mlx_lm_flags import (
    draft_kind,
    fill_mode,
    kv_quant,
    mlx_lm_server_flags,
    refuse_not_yet,
)
from mlxspec.cli.supervisor_flags import add_supervisor_flags, supervisor_config
from mlxspec.config import ServeConfig
from mlxspec.handlers.webchat.tools.mcp_servers import config_error as mcp_config_error

LOGPROBS_FORMATS = ("mlx", "openai")
#: ``MLXSPEC_WARMUP`` values and what they set :attr:`ServeConfig.warmup` to.
WARMUP_MODES = {"0": False, "1": True, "auto": None, "": None}


def serve_options() -> frozenset[str]:
    """Every option string ``mlxspec serve`` takes (``--port``, ``--temp``, ...)."""
    serve = argparse.ArgumentParser(add_help=False)
    sub = _parser()._subparsers
    assert sub is not None
    for action in sub._group_actions:  # the one subparsers action
        serve = action.choices["serve"]  # type: ignore[index]
    return frozenset(serve._option_string_actions)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxspec", description="OpenAI-compatible LLM server on MLX"
    )
    parser.add_argument("--version", action="version", version=f"mlxspec {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over HTTP")
    serve.add_argument(
        "model",
        nargs="?",
        default=None,
        help="MLX model folder, Hugging Face repo id (local cache only) or .gguf file; "
        "default: the embedded SmolLM2-135M-Instruct",
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8080, help="TCP port (default 8080)")
    serve.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=None,
        help="default completion cap when a request sets none (default: until EOS)",
    )
    serve.add_argument("--temperature", type=float, default=None, help="default temperature")
    serve.add_argument("--top-p", type=float, default=None, help="default top_p")
    serve.add_argument("--top-k", type=int, default=None, help="default top_k")
    serve.add_argument(
        "--batch",
        type=_positive_int,
        default=8,
        help="most requests decoding at once (continuous batching); 1 = serial (default 8)",
    )
    _admission_flags(serve)
    _operations_flags(serve)
    _http_edge_flags(serve)
    serve.add_argument(
        "--logprobs-format",
        choices=LOGPROBS_FORMATS,
        default=None,
        help="logprobs shape: 'mlx' (mlx_lm.server's block, the default) or 'openai' "
        "(OpenAI's token/bytes shape, also in stream chunks); env MLXSPEC_LOGPROBS_FORMAT",
    )
    serve.add_argument(
        "--log-level",
        default="info",
        type=str.lower,  # mlx_lm.server spells them DEBUG, INFO, ...
        choices=["debug", "info", "warning", "error", "critical"],
    )
    _add_cache_flags(serve)
    _template_flags(serve)
    _adapter_flags(serve)
    mlx_lm_server_flags(serve)
    add_audio_flags(serve)
    add_supervisor_flags(serve)
    add_jobs_flags(serve)
    return parser


def _adapter_flags(serve: argparse.ArgumentParser) -> None:
    """Where ``POST /v1/adapters`` may read (``--adapter-path``, the adapter mounted
    at start, is mlx_lm.server's flag: :mod:`.mlx_lm_flags`)."""
    serve.add_argument(
        "--adapter-dirs",
        action="append",
        type=_origins,
        default=[],
        metavar="DIRS",
        help="comma-separated directories POST /v1/adapters may mount from (repeatable); "
        "other paths get 403 (default: any directory the server can read); "
        "GET /v1/adapters/available lists the adapters in them",
    )
    serve.add_argument(
        "--max-adapters",
        type=_positive_int,
        default=32,
        metavar="N",
        help="most LoRA adapters mounted at once; the next mount gets 429 too_many_adapters "
        "(default 32: each keeps its matrices in memory and adds a slot to every layer it "
        "touches, and 32 holds a library of task adapters)",
    )
    serve.add_argument(
        "--max-adapter-stack",
        type=_positive_int,
        default=8,
        metavar="N",
        help="most adapters one request may stack ('a+b+...'); more gets 400 "
        "adapter_stack_too_deep (default 8: summed residuals drift off the base model as "
        "they pile up, and each adds a matmul per layer and token)",
    )


def _admission_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--max-queue",
        type=_non_negative_int,
        default=64,
        help="most requests waiting for a decode slot; the next gets 429 queue_full (default 64)",
    )
    serve.add_argument(
        "--max-context",
        type=_positive_int,
        default=None,
        help="cap on prompt + completion tokens per request (default: the model's window)",
    )
    serve.add_argument(
        "--memory-budget",
        type=parse_bytes,
        default=None,
        help="memory the model may use, weights + KV cache, e.g. 8GiB or 500M "
        "(binary units; default: no budget)",
    )
    serve.add_argument(
        "--kv-budget",
        type=parse_bytes,
        default=None,
        help="KV cache the running requests may project together (prompt + max_tokens "
        "each), e.g. 2GiB; requests beyond it wait for a slot (default: no budget)",
    )


def _operations_flags(serve: argparse.ArgumentParser) -> None:
    serve.add_argument(
        "--api-key",
        default=os.environ.get("MLXSPEC_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' or 'x-api-key: KEY' on every route but "
        "/health and /openapi.json (default: $MLXSPEC_API_KEY, else open)",
    )
    serve.add_argument(
        "--allowed-origins",
        action="append",
        type=_origins,
        default=[],
        help="comma-separated CORS origins, or '*' (repeatable; default: CORS off)",
    )
    serve.add_argument(
        "--chat-db",
        metavar="PATH",
        default=None,
        help="the web chat's sessions database (SQLite; default: chat.sqlite3 in "
        "$MLXSPEC_CACHE_DIR, else ~/.cache/mlxspec)",
    )
    serve.add_argument(
        "--web-tools",
        metavar="WORKSPACE_DIR",
        type=_existing_folder,
        default=None,
        help="let the web chat's model read, edit and run commands in WORKSPACE_DIR, "
        "each call approved on the page (default: off)",
    )
    serve.add_argument(
        "--mcp-config",
        metavar="FILE",
        default=None,
        help="an mcpServers JSON file: its stdio MCP servers' tools join the web chat's "
        "tools, each call approved on the page (default: none)",
    )
    serve.add_argument(
        "--web-tool-steps",
        type=_positive_int,
        default=ServeConfig().web_tool_steps,
        help="model steps one web chat turn may take while calling tools (default 8)",
    )
    serve.add_argument(
        "--web-tool-timeout",
        type=_positive_float,
        default=ServeConfig().web_tool_timeout,
        help="seconds one web chat tool call may run before its process group is killed "
        "(default 120)",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=parse_bytes,
        default=ServeConfig().max_body_bytes,
        help="largest request body; larger ones get 413 unread (default 16M)",
    )


def _http_edge_flags(serve: argparse.ArgumentParser) -> None:
    """Host/Origin checks and connection limits (:mod:`mlxspec.http.guard`,
    :mod:`mlxspec.http.connections`)."""
    defaults = ServeConfig()
    serve.add_argument(
        "--allowed-hosts",
        action="append",
        type=_origins,
        default=[],
        help="comma-separated Host names answered besides localhost, 127.0.0.1, [::1] and "
        "--host, or '*' (repeatable); others get 403. Checked when --host is a loopback "
        "address or this is given (default: none)",
    )
    serve.add_argument(
        "--header-timeout",
        type=_positive_float,
        default=defaults.header_timeout,
        metavar="SECONDS",
        help="seconds a request line and headers may take to arrive (default 30)",
    )
    serve.add_argument(
        "--keep-alive-timeout",
        type=_positive_float,
        default=defaults.keep_alive_timeout,
        metavar="SECONDS",
        help="seconds an idle kept-alive connection stays open (default 30)",
    )
    serve.add_argument(
        "--max-header-bytes",
        type=parse_bytes,
        default=defaults.max_header_bytes,
        help="largest request line plus headers; more gets 431 (default 64K)",
    )
    serve.add_argument(
        "--max-connections",
        type=_non_negative_int,
        default=defaults.max_connections,
        help="most open connections; the next gets 503; 0 = no cap (default 1000)",
    )


def _add_cache_flags(serve: argparse.ArgumentParser) -> None:
    """Prompt cache flags (sizes as :func:`parse_bytes` reads them; 0 turns a cache off)."""
    defaults = ServeConfig()
    serve.add_argument(
        "--prompt-cache-bytes",
        type=_byte_size,
        default=defaults.prompt_cache_bytes,
        help="RAM budget for reusing prompt-prefix KV caches across requests; 0 disables "
        "(default 1G)",
    )
    serve.add_argument(
        "--cpu-weights",
        choices=("auto", "float32", "native"),
        default=defaults.cpu_weights,
        help="on the CPU, hold the weights as float32 so MLX multiplies them with the "
        "optimised BLAS (MKL); auto: when that BLAS is loaded and float32 weights fit in "
        "a quarter of RAM; native: as the checkpoint stores them (default auto)",
    )
    serve.add_argument(
        "--ssd-cache",
        metavar="DIR",
        default=None,
        help="keep durable prompt-cache snapshots in DIR, restored after a restart",
    )
    serve.add_argument(
        "--ssd-cache-bytes",
        type=_byte_size,
        default=defaults.ssd_cache_bytes,
        help="disk budget of --ssd-cache; the oldest snapshots go first (default 16G)",
    )


def _template_flags(serve: argparse.ArgumentParser) -> None:
    """Chat templates that requests bring (``chat_template_kwargs.chat_template``),
    what client text may put in a prompt, and usage in streams."""
    defaults = ServeConfig()
    serve.add_argument(
        "--allow-request-templates",
        action="store_true",
        default=None,
        help="let a request bring its own chat template (chat_template_kwargs.chat_template), "
        "rendered within the two bounds below; default: refused with a 400 "
        "(env MLXSPEC_ALLOW_REQUEST_TEMPLATES=1)",
    )
    serve.add_argument(
        "--allow-private-media",
        action="store_true",
        default=None,
        help="let media URLs (image_url, Anthropic image url sources) reach private, loopback "
        "and link-local hosts; default: refused with a 400 (env MLXSPEC_ALLOW_PRIVATE_MEDIA=1)",
    )
    serve.add_argument(
        "--allow-special-tokens-in-content",
        action="store_true",
        help="read special-token strings (e.g. <|im_end|>) in message text, tool arguments and "
        "tool results as control tokens; default: they are ordinary text",
    )
    serve.add_argument(
        "--stream-usage",
        choices=STREAM_USAGE_MODES,
        default=defaults.stream_usage,
        help="'requested' (default): a chat/completion stream carries usage only in the final "
        "chunk stream_options.include_usage asks for (OpenAI); 'always': also on the last "
        "choice's finishing chunk when not asked (mlx-bun's reference behaviour)",
    )
    serve.add_argument(
        "--request-template-steps",
        type=_positive_int,
        default=defaults.request_template_steps,
        help="most steps (loop iterations, calls, filters, output pieces) a request's template "
        f"may take to render (default {defaults.request_template_steps})",
    )
    serve.add_argument(
        "--request-template-seconds",
        type=_positive_float,
        default=defaults.request_template_seconds,
        help="most seconds a request's template may take to render "
        f"(default {defaults.request_template_seconds:g})",
    )


#: ``--stream-usage`` values (:attr:`ServeConfig.stream_usage`).
STREAM_USAGE_MODES = ("requested", "always")

#: ``MLXSPEC_ALLOW_REQUEST_TEMPLATES`` values and what they mean.
SWITCH_VALUES = {"1": True, "true": True, "yes": True, "on": True}
SWITCH_VALUES |= {"0": False, "false": False, "no": False, "off": False, "": False}


def _byte_size(text: str) -> int:
    """A cache budget: :func:`parse_bytes`, or ``0`` (off)."""
    return 0 if text.strip() == "0" else parse_bytes(text)


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be a TCP port, 0-65535")
    return value


_SIZE = re.compile(r"(?i)\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?|b)?\s*")
_UNITS = {None: 1, "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}


def parse_bytes(text: str) -> int:
    """A byte size: a number of bytes, or with a binary unit (``8G``, ``8GB``,
    ``8GiB`` are all 8 x 2**30; ``512m``, ``1.5 GiB``).

    Raises:
        argparse.ArgumentTypeError: not a size, or zero.
    """
    match = _SIZE.fullmatch(text)
    if match is None:
        raise argparse.ArgumentTypeError("must be a size such as 8GiB, 512M or 1073741824")
    number, unit = match.groups()
    value = int(float(number) * _UNITS[unit.lower() if unit else None])
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1 byte")
    return value


def _origins(text: str) -> list[str]:
    return [origin.strip() for origin in text.split(",") if origin.strip()]


def parse_config(argv: Sequence[str] | None = None) -> ServeConfig:
    """Parse ``serve`` arguments into a :class:`ServeConfig` (argparse exits 2 on bad flags).

    ``--logprobs-format`` falls back to ``MLXSPEC_LOGPROBS_FORMAT``, then ``mlx``;
    ``MLXSPEC_WARMUP`` is one of :data:`WARMUP_MODES`; without
    ``--allow-request-templates``, ``MLXSPEC_ALLOW_REQUEST_TEMPLATES`` (one of
    :data:`SWITCH_VALUES`) decides.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    refuse_not_yet(args)
    drafts = draft_kind(args)
    if args.model_flag is not None and args.model not in (None, args.model_flag):
        parser.error(f"two models: MODEL {args.model} and --model {args.model_flag}")
    logprobs_format = args.logprobs_format or os.environ.get("MLXSPEC_LOGPROBS_FORMAT") or "mlx"
    if logprobs_format not in LOGPROBS_FORMATS:
        parser.error(f"MLXSPEC_LOGPROBS_FORMAT must be one of {', '.join(LOGPROBS_FORMATS)}")
    warmup = os.environ.get("MLXSPEC_WARMUP", "auto").strip().lower()
    if warmup not in WARMUP_MODES:
        parser.error("MLXSPEC_WARMUP must be 0, 1 or auto")
    templates = os.environ.get("MLXSPEC_ALLOW_REQUEST_TEMPLATES", "").strip().lower()
    if templates not in SWITCH_VALUES:
        parser.error("MLXSPEC_ALLOW_REQUEST_TEMPLATES must be 1 or 0")
    private_media = os.environ.get("MLXSPEC_ALLOW_PRIVATE_MEDIA", "").strip().lower()
    if private_media not in SWITCH_VALUES:
        parser.error("MLXSPEC_ALLOW_PRIVATE_MEDIA must be 1 or 0")
    if args.mcp_config and (problem := mcp_config_error(args.mcp_config)):
        parser.error(problem)
    return ServeConfig(
        model=args.model or args.model_flag,
        host=args.host,
        port=args.port,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        log_level=args.log_level,
        batch=args.batch,
        max_queue=args.max_queue,
        max_context=args.max_context,
        memory_budget=args.memory_budget,
        kv_budget=args.kv_budget,
        api_key=args.api_key or None,  # an empty key would lock every client out
        allowed_origins=tuple(o for group in args.allowed_origins for o in group),
        max_body_bytes=args.max_body_bytes,
        allowed_hosts=tuple(h for group in args.allowed_hosts for h in group),
        header_timeout=args.header_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        max_header_bytes=args.max_header_bytes,
        max_connections=args.max_connections,
        prompt_cache_bytes=args.prompt_cache_bytes,
        ssd_cache=args.ssd_cache,
        ssd_cache_bytes=args.ssd_cache_bytes,
        logprobs_format=logprobs_format,
        allow_request_templates=args.allow_request_templates or SWITCH_VALUES[templates],
        allow_private_media=args.allow_private_media or SWITCH_VALUES[private_media],
        allow_special_tokens_in_content=args.allow_special_tokens_in_content,
        stream_usage=args.stream_usage,
        request_template_steps=args.request_template_steps,
        request_template_seconds=args.request_template_seconds,
        adapter_path=args.adapter_path,
        adapter_dirs=tuple(d for group in args.adapter_dirs for d in group),
        max_adapters=args.max_adapters,
        max_adapter_stack=args.max_adapter_stack,
        grammar=os.environ.get("MLXSPEC_GRAMMAR", "1") != "0",
        cpu_weights=args.cpu_weights,
        warmup=WARMUP_MODES[warmup],
        trust_remote_code=args.trust_remote_code,
        chat_template=args.chat_template or None,
        use_default_chat_template=args.use_default_chat_template,
        min_p=args.min_p,
        chat_template_args=args.chat_template_args,
        thinking={"on": True, "off": False}.get(args.thinking),
        prefill_step=args.prefill_step_size,
        prompt_concurrency=args.prompt_concurrency,
        prompt_cache_size=args.prompt_cache_size,
        draft_model=args.draft_model,
        draft_kind=drafts,
        num_draft_tokens=args.num_draft_tokens or 3,
        fill=fill_mode(args),
        pipeline=args.pipeline,
        **kv_quant(args),
        chat_db=args.chat_db,
        web_tools=args.web_tools,
        mcp_config=args.mcp_config,
        web_tool_steps=args.web_tool_steps,
        web_tool_timeout=args.web_tool_timeout,
        **audio_config(args),
        **supervisor_config(args, parser),
        **jobs_config(args, parser),
    )

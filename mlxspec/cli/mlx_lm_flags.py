"""``mlxspec serve``'s share of ``mlx_lm.server``'s command line: every flag of
``mlx_lm.server`` 0.32.2 that mlxspec did not already have, with its meaning, so
that an ``mlx_lm.server`` command line runs as ``mlxspec serve`` unchanged, and
the ones whose feature is still missing refused in one line (exit 2)."""

from __future__ import annotations

import argparse
import json
import os
import sys

from mlxspec.cli.argtypes import non_negative_int as _non_negative_int
from mlxspec.cli.argtypes import positive_int as _positive_int

#: mlx_lm.server flags whose feature mlxspec does not have yet: any use is a
#: one-line error (exit 2), never silently ignored.
NOT_YET: dict[str, tuple[str, str]] = {}


def mlx_lm_server_flags(serve: argparse.ArgumentParser) -> None:
    """Every flag of ``mlx_lm.server`` 0.32.2 not already above, with its meaning,
    so an ``mlx_lm.server`` command line runs as ``mlxspec serve`` unchanged
    (``--host``, ``--port``, ``--allowed-origins``, ``--top-p``, ``--top-k``,
    ``--max-tokens``, ``--log-level`` and ``--prompt-cache-bytes`` are shared)."""
    group = serve.add_argument_group("mlx_lm.server flags")
    group.add_argument("--model", dest="model_flag", help="the model (same as MODEL)")
    group.add_argument(
        "--adapter-path",
        "--adapter",
        dest="adapter_path",
        metavar="DIR",
        help="adapter folder (adapters.safetensors + adapter_config.json, as mlx_lm.lora saves "
        "it): a LoRA is mounted at start as the default adapter of requests that name none "
        "(replaceable over /v1/adapters); a DoRA or full fine-tune is applied at load",
    )
    group.add_argument(
        "--trust-remote-code", action="store_true", help="let the tokenizer run the model's code"
    )
    group.add_argument("--chat-template", help="a chat template replacing the model's")
    group.add_argument(
        "--use-default-chat-template",
        action="store_true",
        help="use the tokenizer's default chat template when the model has none",
    )
    group.add_argument("--temp", dest="temperature", type=float, help="same as --temperature")
    group.add_argument("--min-p", type=float, default=None, help="default min_p")
    group.add_argument(
        "--chat-template-args",
        type=_json_object,
        default={},
        help="JSON object of chat template variables, e.g. '{\"enable_thinking\": false}'; "
        "a request's chat_template_kwargs are merged over it",
    )
    group.add_argument(
        "--thinking",
        choices=("on", "off", "auto"),
        default="auto",
        help="default enable_thinking of every prompt; auto leaves it to the chat template "
        "(default auto); a request's chat_template_kwargs or reasoning_effort win",
    )
    group.add_argument(
        "--decode-concurrency", dest="batch", type=_positive_int, help="same as --batch"
    )
    group.add_argument(
        "--prompt-concurrency",
        type=_positive_int,
        default=8,
        help="most prompts prefilled together in the batch (default 8)",
    )
    group.add_argument(
        "--prefill-step-size",
        type=_positive_int,
        default=None,
        help="prompt tokens per prefill chunk (default 128 on the CPU, 512 on a GPU)",
    )
    group.add_argument(
        "--prompt-cache-size",
        type=_non_negative_int,
        default=None,
        help="most KV caches the prompt cache keeps (default: bounded by bytes only)",
    )
    group.add_argument(
        "--draft-model",
        default=None,
        metavar="PATH",
        help="a smaller model of the same tokenizer whose drafts the model verifies in the "
        "batched decode step (speculative decoding; greedy output is unchanged)",
    )
    group.add_argument(
        "--num-draft-tokens",
        type=_positive_int,
        default=None,
        help="most draft tokens per row and step (default 3)",
    )
    group.add_argument(
        "--draft-kind",
        choices=("model", "ngram"),
        default=None,
        help="model: drafts from --draft-model (the default with it); ngram: prompt lookup "
        "over the prompt and the answer so far, no draft model",
    )
    group.add_argument(
        "--fill",
        choices=("off", "strict", "echo"),
        default=None,
        help="strict: where a request's grammar (structured output, forced tool calls) forces "
        "the next text, feed it in one forward, checked against the model's own choice, so "
        "greedy output is unchanged (usage.fill); default: $MLXSPEC_FILL, else off",
    )
    group.add_argument(
        "--pipeline",
        action="store_true",
        help="under mlx.launch: split the model's layers across the processes (pipeline "
        "parallel) instead of each layer's heads (tensor parallel, the default)",
    )
    _kv_flags(group)
    for dest, (flag, feature) in NOT_YET.items():
        group.add_argument(flag, dest=dest, default=None, help=f"not supported yet ({feature})")


#: ``--kv-quant`` values (``mlxspec.engine.caches.kv_scheme.KV_QUANT_MODES``).
KV_QUANT = ("bf16", "kv8", "kv4", "config")


def _kv_flags(group: argparse._ArgumentGroup) -> None:
    """KV cache quantisation: mlx_lm.server's three flags and the reference's
    ``--kv-quant`` (checked together by :func:`kv_quant`)."""
    group.add_argument(
        "--kv-bits",
        type=int,
        default=None,
        help="quantise the KV cache to 4 or 8 bits (same as --kv-quant kv4|kv8; batching stays on)",
    )
    group.add_argument(
        "--kv-group-size",
        type=int,
        default=None,
        help="elements per scale of the quantised KV cache: 32, 64 or 128 (default 64)",
    )
    group.add_argument(
        "--quantized-kv-start",
        type=_non_negative_int,
        default=None,
        help="tokens a sequence's KV cache holds before it is quantised (default 0: from the "
        "first; mlx_lm.server's default is 5000)",
    )
    group.add_argument(
        "--kv-quant",
        choices=KV_QUANT,
        default=None,
        help="KV cache precision: bf16 (none, the default), kv8, kv4, or config (per layer "
        "from the model folder's kv_config.json, or --kv-config)",
    )
    group.add_argument(
        "--kv-config",
        default=None,
        metavar="PATH",
        help="the kv_config.json of --kv-quant config (default: the model folder's)",
    )


def kv_quant(args: argparse.Namespace) -> dict:
    """The KV quantisation fields of ``ServeConfig`` from the flags; a value or
    combination that cannot work exits 2 with one line naming the flag."""
    bits, mode, group = args.kv_bits, args.kv_quant, args.kv_group_size
    problem = None
    if bits is not None and bits not in (4, 8):
        problem = f"--kv-bits: {bits} is not served; use 4 or 8"
    elif bits is not None and mode == "config":
        problem = "--kv-bits: --kv-quant config takes each layer's bits from kv_config.json"
    elif bits is not None and mode not in (None, f"kv{bits}"):
        problem = f"--kv-bits: {bits} contradicts --kv-quant {mode}"
    elif group is not None and group not in (32, 64, 128):
        problem = f"--kv-group-size: {group} is not one of 32, 64, 128"
    elif args.kv_config is not None and mode != "config":
        problem = "--kv-config: needs --kv-quant config"
    mode = mode or (f"kv{bits}" if bits is not None else "bf16")
    if problem is None and mode == "bf16":
        if group is not None:
            problem = "--kv-group-size: needs --kv-bits or --kv-quant kv8|kv4|config"
        elif args.quantized_kv_start is not None:
            problem = "--quantized-kv-start: needs --kv-bits or --kv-quant kv8|kv4|config"
    if problem is not None:
        print(f"mlxspec: error: {problem}", file=sys.stderr)
        sys.exit(2)
    return {
        "kv_quant": mode,
        "kv_group_size": group or 64,
        "quantized_kv_start": args.quantized_kv_start or 0,
        "kv_config": args.kv_config,
    }


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def draft_kind(args: argparse.Namespace) -> str | None:
    """The draft source the flags name (``None``: no speculation); a combination
    that cannot work exits 2 with one line naming the flag."""
    kind = args.draft_kind or ("model" if args.draft_model is not None else None)
    problem = None
    if kind == "ngram" and args.draft_model is not None:
        problem = "--draft-kind: ngram mounts no draft model; drop --draft-model"
    elif kind == "model" and args.draft_model is None:
        problem = "--draft-kind: model needs --draft-model PATH"
    elif kind is None and args.num_draft_tokens is not None:
        problem = "--num-draft-tokens: needs --draft-model or --draft-kind ngram"
    if problem is not None:
        print(f"mlxspec: error: {problem}", file=sys.stderr)
        sys.exit(2)
    return kind


def fill_mode(args: argparse.Namespace) -> str:
    """Token fast-forwarding's mode: ``--fill``, else ``MLXSPEC_FILL``, else
    ``off`` (the reference's ``MLX_BUN_FILL``); ``echo`` (spans copied from
    earlier in a session) and unknown values exit 2 with one line."""
    mode = args.fill or os.environ.get("MLXSPEC_FILL", "").strip().lower() or "off"
    problem = None
    if mode == "echo":
        problem = "--fill: echo is not supported yet (strict is)"
    elif mode not in ("off", "strict"):
        problem = f"MLXSPEC_FILL: {mode} is not one of off, strict"
    if problem is not None:
        print(f"mlxspec: error: {problem}", file=sys.stderr)
        sys.exit(2)
    return mode


def refuse_not_yet(args: argparse.Namespace) -> None:
    """Exit 2 with one line when a :data:`NOT_YET` flag is used."""
    for dest, (flag, feature) in NOT_YET.items():
        if getattr(args, dest) not in (None, False):
            print(f"mlxspec: error: {flag}: {feature} is not supported yet", file=sys.stderr)
            sys.exit(2)

"""``mlxspec serve``'s share of ``mlx_lm.server``'s command line: every flag of
``mlx_lm.server`` 0.32.2 that mlxspec did not already have, with its meaning, so
that an ``mlx_lm.server`` command line runs as ``mlxspec serve`` unchanged, and
the ones whose feature is still missing refused in one line (exit 2)."""

from __future__ import annotations

import argparse
import json
import sys

from mlxspec.cli.argtypes import non_negative_int as _non_negative_int
from mlxspec.cli.argtypes import positive_int as _positive_int

#: mlx_lm.server flags whose feature mlxspec does not have yet: any use is a
#: one-line error (exit 2), never silently ignored.
NOT_YET = {
    "kv_bits": ("--kv-bits", "KV cache quantization"),
    "kv_group_size": ("--kv-group-size", "KV cache quantization"),
    "quantized_kv_start": ("--quantized-kv-start", "KV cache quantization"),
}


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
        "--pipeline",
        action="store_true",
        help="under mlx.launch: split the model's layers across the processes (pipeline "
        "parallel) instead of each layer's heads (tensor parallel, the default)",
    )
    for dest, (flag, feature) in NOT_YET.items():
        group.add_argument(flag, dest=dest, default=None, help=f"not supported yet ({feature})")


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


def refuse_not_yet(args: argparse.Namespace) -> None:
    """Exit 2 with one line when a :data:`NOT_YET` flag is used."""
    for dest, (flag, feature) in NOT_YET.items():
        if getattr(args, dest) not in (None, False):
            print(f"mlxspec: error: {flag}: {feature} is not supported yet", file=sys.stderr)
            sys.exit(2)

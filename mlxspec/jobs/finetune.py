"""The fine-tune job: a ``FinetuneSubmit`` body (reference, "Fine-tune") mapped
onto ``mlx_lm.lora``'s training, with ``metric`` events from its callback.

SFT runs on mlx-lm's own pieces (``load``, ``tuner.datasets.load_dataset``,
``lora.train_model`` with a ``TrainingCallback``: mlx-lm's ``lora.run`` drops a
callback it is given). The result is an adapter folder as ``mlx_lm.lora`` saves it
(``adapters.safetensors`` + ``adapter_config.json``), which ``--adapter-path`` and
``POST /v1/adapters`` mount. Each field is mapped (:data:`MAPPED`), unused by the
method that runs (``dpo_*``, ``orpo_*`` under SFT), or refused: a value mlx-lm's
trainer has no knob for fails the job with a ``failed`` event naming the field.
DPO and ORPO need a preference trainer that is not installed (``mlx-lm-lora``), so
they are refused by name.
"""

from __future__ import annotations

import math
import types
from pathlib import Path
from typing import Any

from mlxspec.jobs.datasets import inspect_folder
from mlxspec.jobs.runner import Emit, JobRefused

__all__ = ["DEFAULTS", "MAPPED", "REFUSED_UNLESS_DEFAULT", "run_finetune", "training_args"]

#: The reference's defaults (``DEFAULT_TRAIN_CONFIG``) of the fields a body may leave out.
DEFAULTS: dict[str, Any] = {
    "method": "sft", "rank": 16, "scale": 20.0, "num_layers": 0, "iters": 300,
    "learning_rate": 2e-4, "max_seq_length": 2048, "batch_size": 1,
    "grad_accumulation_steps": 1, "seed": 0, "steps_per_report": 1, "steps_per_eval": 0,
    "weight_decay": 0.0, "lora_dropout": 0.0, "save_checkpoints": True,
    "val_max_examples": 0, "sft_scope": "full", "target_modules": None,
    "warm_start_adapter": None, "grad_checkpoint": False,
}  # fmt: skip
#: Fields mapped onto mlx-lm's training arguments.
MAPPED = frozenset(DEFAULTS) | {"model_dir", "data_dir", "adapter_path"}
#: Fields mlx-lm's LoRA trainer has no knob for: refused unless left at the
#: reference's default (the value that means "off").
REFUSED_UNLESS_DEFAULT: dict[str, Any] = {
    "rank_scaling": None, "rs_lora": False, "lora_plus_ratio": 1, "mlp_split": False,
    "segment_size": 0, "grad_clip_norm": 0,
}  # fmt: skip
#: Fields of the preference methods, unused by SFT.
PREFERENCE_FIELDS = frozenset(
    {"dpo_beta", "dpo_warmup_iters", "dpo_lr_schedule", "orpo_lambda", "orpo_warmup_iters",
     "orpo_lr_schedule", "orpo_chunk_size", "orpo_fused_ce", "orpo_flash_ce",
     "orpo_prefix_shared"}
)  # fmt: skip


def _refusals(body: dict[str, Any]) -> None:
    """Raise :class:`JobRefused` for a field this trainer cannot honour."""
    method = body.get("method", "sft")
    if method in ("dpo", "orpo"):
        raise JobRefused(
            f"method {method!r} is not available: it needs a preference trainer "
            "(mlx-lm-lora), which this installation does not have; use method 'sft'"
        )
    if method != "sft":
        raise JobRefused(f"method {method!r} is unknown (sft, dpo or orpo)")
    for name, off in REFUSED_UNLESS_DEFAULT.items():
        if body.get(name) is not None and body[name] != off:
            raise JobRefused(
                f"{name}={body[name]!r} is not supported by mlx_lm.lora's trainer "
                f"(leave it at {off!r})"
            )
    if body.get("sft_scope", "full") not in ("full", "response"):
        raise JobRefused(f"sft_scope {body['sft_scope']!r} must be 'full' or 'response'")
    unknown = set(body) - MAPPED - set(REFUSED_UNLESS_DEFAULT) - PREFERENCE_FIELDS
    if unknown:
        raise JobRefused(f"unknown field {sorted(unknown)[0]!r}")
    if not body.get("adapter_path"):
        raise JobRefused("adapter_path is missing")


def training_args(body: dict[str, Any]) -> types.SimpleNamespace:
    """``mlx_lm.lora``'s argument namespace for an SFT body.

    Args:
        body (dict): the stored ``FinetuneSubmit`` (paths already resolved).

    Returns:
        SimpleNamespace: mlx-lm's ``CONFIG_DEFAULTS`` overridden by the body:
        ``num_layers`` 0 is every layer (-1), ``steps_per_eval`` 0 is at the
        start and the end only, ``val_max_examples`` N is ``ceil(N/batch)``
        validation batches (0 all), ``weight_decay`` > 0 picks AdamW,
        ``sft_scope: response`` masks the prompt, ``save_checkpoints: false``
        saves only at the end, ``warm_start_adapter`` resumes its weights.

    Raises:
        JobRefused: a field cannot be honoured (see :func:`_refusals`).
    """
    _refusals(body)  # before mlx-lm's import: a refused job ends at once
    from mlx_lm.lora import CONFIG_DEFAULTS

    c = {**DEFAULTS, **{k: v for k, v in body.items() if v is not None}}
    args = {**CONFIG_DEFAULTS, "model": body["model_dir"], "data": body["data_dir"]}
    lora = {"rank": int(c["rank"]), "scale": float(c["scale"]), "dropout": c["lora_dropout"]}
    if c["target_modules"]:
        lora["keys"] = list(c["target_modules"])
    iters, batch = int(c["iters"]), int(c["batch_size"])
    optimizer = "adamw" if c["weight_decay"] else "adam"
    args.update(
        train=True, adapter_path=body["adapter_path"], fine_tune_type="lora",
        num_layers=int(c["num_layers"]) or -1, iters=iters, batch_size=batch,
        learning_rate=float(c["learning_rate"]), max_seq_length=int(c["max_seq_length"]),
        grad_accumulation_steps=int(c["grad_accumulation_steps"]), seed=int(c["seed"]),
        steps_per_report=max(1, int(c["steps_per_report"])),
        steps_per_eval=int(c["steps_per_eval"]) or iters,
        grad_checkpoint=bool(c["grad_checkpoint"]),
        val_batches=math.ceil(int(c["val_max_examples"]) / batch) if c["val_max_examples"] else -1,
        optimizer=optimizer, lora_parameters=lora, mask_prompt=c["sft_scope"] == "response",
        save_every=100 if c["save_checkpoints"] else iters + 1, report_to=None,
        optimizer_config={"adamw": {"weight_decay": float(c["weight_decay"])}},
        resume_adapter_file=None,
    )  # fmt: skip
    if c["warm_start_adapter"]:
        args["resume_adapter_file"] = str(Path(c["warm_start_adapter"]) / "adapters.safetensors")
    return types.SimpleNamespace(**args)


class _Metrics:
    """mlx-lm's ``TrainingCallback``: each report becomes a ``metric`` event."""

    def __init__(self, emit: Emit, iters: int) -> None:
        self.emit, self.iters = emit, iters
        self.last: dict[str, float] = {}

    def on_train_loss_report(self, info: dict[str, Any]) -> None:
        step = int(info["iteration"])
        self.last["train_loss"] = float(info["train_loss"])
        self.emit(
            {
                "type": "metric", "kind": "train", "step": step,
                "loss": float(info["train_loss"]),
                "learning_rate": float(info["learning_rate"]),
                "tokens_per_sec": float(info["tokens_per_second"]),
                "iterations_per_sec": float(info["iterations_per_second"]),
                "trained_tokens": int(info["trained_tokens"]),
                "peak_memory_gb": float(info["peak_memory"]),
                "progress": min(1.0, step / max(1, self.iters)),
            }
        )  # fmt: skip

    def on_val_loss_report(self, info: dict[str, Any]) -> None:
        self.last["val_loss"] = float(info["val_loss"])
        step = max(0, int(info["iteration"]))
        self.emit(
            {"type": "metric", "kind": "val", "step": step, "loss": float(info["val_loss"]),
             "val_time": float(info["val_time"])}
        )  # fmt: skip


def run_finetune(body: dict[str, Any], emit: Emit) -> tuple[str, dict[str, Any]]:
    """Run an SFT job (in the runner process).

    Args:
        body (dict): the stored ``FinetuneSubmit``.
        emit (Emit): the job's event sink.

    Returns:
        tuple[str, dict]: the adapter folder and the summary (iterations, last
        train and validation loss, the data's format and row counts).

    Raises:
        JobRefused: a refused field, or a dataset that cannot be trained on
            (broken lines named with their numbers).
    """
    args = training_args(body)
    report = inspect_folder(Path(args.data))
    if report.error:
        raise JobRefused(f"dataset: {report.error}")
    if report.format == "dpo":
        raise JobRefused("dataset: dpo rows (chosen/rejected) need method dpo or orpo")
    emit({"type": "stage", "stage": "load", "progress": 0.0, "message": "loading the model"})
    import mlx.core as mx
    import numpy as np
    from mlx_lm.lora import train_model
    from mlx_lm.tuner.datasets import load_dataset
    from mlx_lm.utils import load

    np.random.seed(args.seed)
    mx.random.seed(args.seed)
    loaded = load(args.model)  # (model, tokenizer) or with the config as a third
    model, tokenizer = loaded[0], loaded[1]
    train_set, valid_set, _ = load_dataset(args, tokenizer)  # type: ignore[arg-type]
    emit({"type": "stage", "stage": "train", "progress": 0.0, "message": f"{args.iters} steps"})
    metrics = _Metrics(emit, args.iters)
    train_model(args, model, train_set, valid_set, metrics)  # type: ignore[arg-type]
    summary = {"iters": args.iters, "format": report.format, "n_train": report.n_train}
    summary.update(n_valid=report.n_valid, **metrics.last)
    return str(args.adapter_path), summary

"""Loading a resolved model folder into MLX, with mlx_lm.server's loading flags:
``--adapter-path``, ``--trust-remote-code``, ``--chat-template`` and
``--use-default-chat-template`` (its ``ModelProvider._load``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxspec.engine.model.loader import ModelLoadError, check_json_files

__all__ = ["LoadOptions", "adapter_fingerprint", "load_model"]


@dataclass(frozen=True)
class LoadOptions:
    """How ``mlx_lm.load`` loads the model: mlx_lm.server's loading flags.

    Args:
        adapter_path (str | None): a LoRA (or DoRA, or full fine-tune) adapter
            folder (``adapter_config.json`` + ``adapters.safetensors``), applied
            with mlx-lm's ``load_adapters``. Default: ``None``.
        trust_remote_code (bool): let the tokenizer run the model's own code.
            Default: ``False``.
        chat_template (str | None): a chat template replacing the tokenizer's.
            Default: ``None``.
        use_default_chat_template (bool): when the model has no chat template,
            use the tokenizer class's default one. Default: ``False``.
        shard (Callable[[nn.Module], None] | None): splits the lazily loaded
            model in place for this rank of a sharded server, before any weight
            is read (:func:`~mlxspec.engine.distributed.shards.apply_shard`).
            Default: ``None`` (the whole model, loaded at once).
    """

    adapter_path: str | None = None
    trust_remote_code: bool = False
    chat_template: str | None = None
    use_default_chat_template: bool = False
    shard: Callable[[Any], None] | None = None


def load_model(path: Path, options: LoadOptions = LoadOptions()) -> tuple[Any, Any]:
    """Load a model folder as mlx_lm.server does (``mlx_lm.load`` with its
    ``adapter_path`` and ``tokenizer_config``; ``ModelProvider._load``).

    Args:
        path (Path): an MLX model folder.
        options (LoadOptions): adapter and tokenizer options. Default: none.

    Returns:
        tuple: the ``nn.Module`` and its ``TokenizerWrapper``.

    Raises:
        ModelLoadError: the adapter folder is missing or broken, or
            ``use_default_chat_template`` finds no default template.
    """
    from mlx_lm import load

    adapter = options.adapter_path
    if adapter is not None:
        folder = Path(adapter).expanduser()
        if not (folder / "adapter_config.json").is_file():
            raise ModelLoadError(f"adapter not found: {adapter} has no adapter_config.json")
        check_json_files(folder)
        adapter = str(folder)
    tokenizer_config: dict[str, Any] = {"trust_remote_code": options.trust_remote_code}
    if options.chat_template:
        tokenizer_config["chat_template"] = options.chat_template
    # load's annotation also allows the (model, tokenizer, config) of return_config=True.
    model, tokenizer = load(
        str(path),
        adapter_path=adapter,
        tokenizer_config=tokenizer_config,
        trust_remote_code=options.trust_remote_code,
        lazy=options.shard is not None,
    )[:2]
    if options.shard is not None:  # this rank's shard only is read
        import mlx.core as mx

        options.shard(model)
        mx.eval(model.parameters())
    if adapter is not None:
        import mlx.core as mx

        # The adapter's tensors are still lazy loads made on this thread's stream; the
        # engine thread cannot evaluate them ("There is no Stream(cpu, 0) in current thread").
        mx.eval(model.parameters())
    if options.use_default_chat_template and tokenizer.chat_template is None:
        default = getattr(tokenizer, "default_chat_template", None)
        if default is None:
            raise ModelLoadError(
                "--use-default-chat-template: the model has no chat template and its "
                "tokenizer class has no default one; pass --chat-template instead"
            )
        tokenizer.chat_template = default
    return model, tokenizer


def adapter_fingerprint(adapter_path: str | None) -> str | None:
    """A cheap fingerprint of an adapter folder (its config and weights, as
    :func:`weights_fingerprint` reads a model), or ``None`` without one."""
    if adapter_path is None:
        return None
    folder = Path(adapter_path).expanduser()
    files = [folder / "adapter_config.json", *sorted(folder.glob("*.safetensors"))]
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(f"{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()[:16]

"""Server configuration, parsed once at the edge into a frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass


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
        grammar (bool): enforce structured output with xgrammar; ``False``
            (environment ``MLXSPEC_GRAMMAR=0``) answers every constraint with the
            degrade path. Default: ``True``.
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
    grammar: bool = True

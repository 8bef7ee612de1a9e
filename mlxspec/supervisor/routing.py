"""Model ids and routing: the one pure function from a request's ``model`` to
the id of the pool child that serves it (reference, "Internal routes": the
generating routes are routed by the body's ``model`` under ``--model-pool``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

#: The routes whose JSON body's ``model`` picks the child (reference, route index).
ROUTED_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/v1/embeddings",
    }
)
#: A GGUF file's quantisation suffix, dropped from its id (as the loader does).
_QUANT_SUFFIX = re.compile(r"[.-](?:I?Q\d\w*|[Ff]16|[Ff]32|[Bb][Ff]16)$")


def model_id(spec: str | None) -> str:
    """The id ``/v1/models`` lists for a model spec, without loading it: the
    folder's name, a GGUF file's stem less its quantisation suffix, else the
    spec itself (a Hugging Face repo id); the embedded default's id for ``None``.
    (The same rules as :func:`mlxspec.engine.model.loader.resolve_model`.)"""
    if spec is None:
        from mlxspec.engine.model.loader import EMBEDDED_DEFAULT

        return EMBEDDED_DEFAULT.model_id
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        return _QUANT_SUFFIX.sub("", path.stem) or path.stem
    if path.is_dir():
        return path.resolve().name
    return spec


def route(
    requested: object, ids: Sequence[str], default: str, aliases: dict[str, str] | None = None
) -> str:
    """The id of the child that serves a request whose body names ``requested``.

    Args:
        requested (object): the body's ``model`` (any JSON value, or ``None`` if absent).
        ids (Sequence[str]): the pool's model ids.
        default (str): the id that serves a request naming no pool model.
        aliases (dict[str, str] | None): other names of pool models (a spec as
            given on the command line) -> id. Default: ``None``.

    Returns:
        str: a pool id. A name that is no pool model goes to ``default``, which
        answers it by its own rules (one of its adapters; a 404
        ``model_not_found`` under ``--strict-model``; else ignored).
    """
    if isinstance(requested, str):
        if requested in ids:
            return requested
        if aliases and requested in aliases:
            return aliases[requested]
    return default

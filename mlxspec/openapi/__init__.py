"""The OpenAPI 3.1 document that defines mlxspec's HTTP API.

``openapi.yaml`` in this package is the contract for every route: request schemas
(where all request validation lives: types, ranges, enums, required fields),
every response status with its schema, and examples. The app hands it to
Connexion, which routes each ``operationId`` to a handler; tests check responses
against it.
"""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import yaml

__all__ = ["SPEC_PATH", "load_spec", "served_spec"]

SPEC_PATH: Path = Path(__file__).with_name("openapi.yaml")
"""Path of the OpenAPI document shipped with the package."""


@functools.cache
def _parsed_spec() -> dict[str, Any]:
    with SPEC_PATH.open(encoding="utf-8") as f:
        spec = yaml.safe_load(f)
    if not isinstance(spec, dict):
        raise ValueError(f"{SPEC_PATH} does not hold a YAML mapping")
    return spec


def load_spec() -> dict[str, Any]:
    """Return the parsed OpenAPI document.

    The file is read and parsed once; each call returns a deep copy, so callers
    may mutate the result (Connexion resolves ``$ref`` in place, for example).

    Returns:
        dict[str, Any]: The document, with ``$ref`` left unresolved.

    Raises:
        ValueError: If the file does not hold a YAML mapping.
    """
    return copy.deepcopy(_parsed_spec())


#: Overlay key: schema keywords that replace their siblings when the server
#: runs with ``--logprobs-format openai`` (OpenAI's wider ``top_logprobs``).
LOGPROBS_OPENAI_KEY = "x-mlxspec-logprobs-openai"
#: Overlay key: schema keywords that replace their siblings when the server
#: runs without ``--allow-request-templates`` (``chat_template`` refused).
REQUEST_TEMPLATES_OFF_KEY = "x-mlxspec-request-templates-off"


#: Operation key: the route exists only on a worker bound to a unix socket
#: (``--unix``: ``/admin/drain``, ``/admin/lease``), never on TCP.
UNIX_ONLY_KEY = "x-mlxspec-unix-only"
#: Operation key: the route exists only on a server started with ``--jobs``
#: (``/api/jobs``, ``/api/finetune/*``, ``/api/quantize/*``, ``/api/dataset/*``).
JOBS_ONLY_KEY = "x-mlxspec-jobs"
#: Operation key: the route is answered by the ``--isolate`` parent itself
#: (``GET /engine``), so no Connexion app serves it.
PARENT_ONLY_KEY = "x-mlxspec-isolate-parent"


def served_spec(
    logprobs_format: str = "mlx",
    request_templates: bool = False,
    unix: bool = False,
    jobs: bool = False,
) -> dict[str, Any]:
    """The document a server with these settings serves and validates with.

    One document describes every setting: a schema may carry overlays, each a
    mapping of keywords that override its own under one setting:
    ``x-mlxspec-logprobs-openai`` when ``logprobs_format`` is ``"openai"``
    (e.g. ``top_logprobs``'s ``maximum: 20`` instead of mlx-lm's 11), and
    ``x-mlxspec-request-templates-off`` unless ``request_templates`` (a
    request's ``chat_template_kwargs.chat_template`` must be null). The
    overlay keys are removed either way, so the served document states the
    live rules only.

    Args:
        logprobs_format (str): ``"mlx"`` or ``"openai"``. Default: ``"mlx"``.
        request_templates (bool): ``--allow-request-templates``. Default: ``False``.
        unix (bool): the server listens on a unix socket (``--unix``): the
            operations marked ``x-mlxspec-unix-only`` are kept, else dropped.
            Operations marked ``x-mlxspec-isolate-parent`` are always dropped. Default: ``False``.
        jobs (bool): the server runs jobs (``--jobs``): the operations marked
            ``x-mlxspec-jobs`` are kept, else dropped. Default: ``False``.

    Returns:
        dict[str, Any]: a fresh copy of the document, ``$ref`` unresolved.
    """
    spec = load_spec()
    active = {LOGPROBS_OPENAI_KEY: logprobs_format == "openai"}
    active[REQUEST_TEMPLATES_OFF_KEY] = not request_templates
    _overlay(spec, active)
    for path, item in list(spec.get("paths", {}).items()):
        for method, op in list(item.items()):
            if not isinstance(op, dict):
                continue
            unix_only, jobs_only = op.pop(UNIX_ONLY_KEY, False), op.pop(JOBS_ONLY_KEY, False)
            parent_only = op.pop(PARENT_ONLY_KEY, False)
            if parent_only or (unix_only and not unix) or (jobs_only and not jobs):
                del item[method]
        if not item:
            del spec["paths"][path]
    return spec


def _overlay(node: Any, active: dict[str, bool]) -> None:
    if isinstance(node, dict):
        for key, apply in active.items():
            extra = node.pop(key, None)
            if apply and isinstance(extra, dict):
                node.update(copy.deepcopy(extra))
        for value in node.values():
            _overlay(value, active)
    elif isinstance(node, list):
        for value in node:
            _overlay(value, active)

"""Which mounted adapters a generation request selects (reference, "Adapters (LoRA
hot-swap)"; vLLM's ``model: <lora name>``).

Precedence: the body's ``adapter`` (a spec: ``"id"``, ``"a+b"``, ``"a,b"``,
``"none"``); else a ``model`` that names a mounted adapter; else the server's
default (``--adapter-path``) while it is mounted; else the base model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlxspec.engine import AdapterError, EngineProtocol, parse_spec
from mlxspec.errors import ApiError
from mlxspec.handlers.context import served_spec_names


def request_adapters(engine: EngineProtocol, body: Mapping[str, Any]) -> tuple[str, ...]:
    """The adapter ids ``body`` generates with, in summing order; ``()`` is the base model.

    Args:
        engine (EngineProtocol): the serving engine (its ``adapters``).
        body (Mapping): a chat or completion body (other surfaces carry their
            ``adapter`` and ``model`` onto it).

    Returns:
        tuple[str, ...]: mounted ids.

    Raises:
        AdapterStackError: more ids than ``--max-adapter-stack`` (400).
        AdapterError: a malformed spec, or an id that is not mounted (400, naming it).
    """
    check_model(engine, body.get("model"))
    registry = engine.adapters
    spec = body.get("adapter")
    if spec is not None:
        return registry.check(parse_spec(spec, max_stack=registry.limits.max_stack))
    mounted = registry.ids()
    model = body.get("model")
    if isinstance(model, str) and model in mounted:
        return (model,)
    if registry.default is not None and registry.default in mounted:
        return (registry.default,)
    return ()


def with_model(chat: dict[str, Any], body: Mapping[str, Any]) -> dict[str, Any]:
    """``chat`` (a surface's body translated for ``open_turn``) with the surface
    body's ``model``, which selects a mounted adapter of that id."""
    return {**chat, "model": body.get("model")} if body.get("model") is not None else chat


def servable_ids(engine: EngineProtocol, spec: str | None = None) -> list[str]:
    """The names a ``model`` may give on this server: the served model's id, the
    spec it was started from (a folder or repo id as typed), the mounted adapters."""
    names = [engine.info.id]
    if spec is not None and spec != engine.info.id:
        names.append(spec)
    return names + [a for a in engine.adapters.ids() if a not in names]


def check_model(engine: EngineProtocol, model: object) -> None:
    """Under ``--strict-model``, refuse a ``model`` that names nothing served.

    A name is the served model's id or its spec, a mounted adapter, or a stack
    of mounted adapters (``"a+b"``). Without the flag every name is accepted
    (agents send ids of their own) and the served model answers.

    Raises:
        ApiError: 404 ``model_not_found`` naming the servable ids (param ``model``).
    """
    strict, spec = served_spec_names()
    if not strict or not isinstance(model, str):
        return
    names = servable_ids(engine, spec)
    if model in names:
        return
    try:
        engine.adapters.check(parse_spec(model, max_stack=engine.adapters.limits.max_stack))
        return
    except (AdapterError, ValueError):
        pass
    raise ApiError(
        "model_not_found",
        f"model '{model}' not found: this server serves {', '.join(names)}",
        param="model",
    )

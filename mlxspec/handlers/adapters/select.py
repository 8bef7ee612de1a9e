"""Which mounted adapters a generation request selects (reference, "Adapters (LoRA
hot-swap)"; vLLM's ``model: <lora name>``).

Precedence: the body's ``adapter`` (a spec: ``"id"``, ``"a+b"``, ``"a,b"``,
``"none"``); else a ``model`` that names a mounted adapter; else the server's
default (``--adapter-path``) while it is mounted; else the base model.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mlxspec.engine import EngineProtocol, parse_spec


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

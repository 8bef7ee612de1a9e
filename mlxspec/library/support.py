"""Whether mlxspec can serve an architecture: mlx-lm's or mlx-vlm's model classes.

``support_tier`` follows the reference's names: ``"targeted"`` when mlx-lm (a
text model) or mlx-vlm (a model with a ``vision_config``) has a module for the
config's ``model_type`` (after mlx-lm's ``MODEL_REMAPPING``), ``None`` otherwise.
mlxspec has no universal fallback module, so ``"generic"`` never occurs
(docs/deviations.md). Modules are located with ``importlib.util.find_spec``,
never imported.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Mapping
from typing import Any


@functools.cache
def _has_module(package: str, name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{package}.{name}") is not None
    except (ImportError, ValueError):
        return False


@functools.cache
def _remapping() -> dict[str, str]:
    try:
        from mlx_lm.utils import MODEL_REMAPPING
    except ImportError:
        return {}
    return dict(MODEL_REMAPPING)


def support_tier(config: Mapping[str, Any]) -> str | None:
    """``"targeted"`` when mlx-lm (or, with a ``vision_config``, mlx-vlm) knows
    ``config["model_type"]``; ``None`` for an unknown or missing type.

    Args:
        config (Mapping): a model's ``config.json``.
    """
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type.isidentifier():
        return None
    if isinstance(config.get("vision_config"), dict):
        if _has_module("mlx_vlm.models", model_type):
            return "targeted"
    name = _remapping().get(model_type, model_type)
    return "targeted" if _has_module("mlx_lm.models", name) else None


def media(config: Mapping[str, Any]) -> tuple[bool, bool]:
    """``(vision, audio)``: a ``vision_config`` / ``audio_config`` section, as
    the loader reads them (``engine/model/vision.py`` ``media_kinds``)."""
    return isinstance(config.get("vision_config"), dict), isinstance(
        config.get("audio_config"), dict
    )


def quantization(config: Mapping[str, Any]) -> tuple[int | None, int | None]:
    """``(bits, group_size)`` of mlx-lm's ``quantization`` (or
    ``quantization_config``) section; ``(None, None)`` for an unquantised model."""
    for key in ("quantization", "quantization_config"):
        section = config.get(key)
        if isinstance(section, dict):
            bits, group = section.get("bits"), section.get("group_size")
            return (
                bits if isinstance(bits, int) and not isinstance(bits, bool) else None,
                group if isinstance(group, int) and not isinstance(group, bool) else None,
            )
    return None, None

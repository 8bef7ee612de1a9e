"""Adapter ids and the ``adapter`` field's spec: ``"id"``, ``"a+b"`` / ``"a,b"``, ``"none"``.

Pure text rules, no MLX (reference, "Adapters (LoRA hot-swap)": ``parseAdapterSpec``):
a spec names mounted adapters in the order their LoRA residuals are summed, and
``"none"`` (or an empty string) asks for the base model.
"""

from __future__ import annotations

import re

from mlxspec.engine.types import EngineRequestError

#: The spec that selects no adapter (the base model).
NONE = "none"
#: An adapter id: it appears in specs (``+`` and ``,`` separate ids) and in
#: ``DELETE /v1/adapters/{id}`` paths, so it is a plain token.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
_ID = re.compile(ID_PATTERN)
#: Ids no adapter may take: ``none`` is the base model, ``available`` is the
#: ``GET /v1/adapters/available`` path.
RESERVED_IDS = frozenset({NONE, "available"})
_SEPARATORS = re.compile(r"[+,]")


class AdapterError(EngineRequestError):
    """An adapter request that cannot be served as given (a 400): an unknown or
    malformed id, a folder that is not a LoRA adapter, an adapter that does not
    fit the served model. ``message`` names what is wrong."""


class AdapterLimitError(AdapterError):
    """A mount past ``--max-adapters`` (429 ``too_many_adapters``): unmount one first."""

    error_kind = "too_many_adapters"


class AdapterStackError(AdapterError):
    """A spec stacking more than ``--max-adapter-stack`` adapters (400
    ``adapter_stack_too_deep``)."""

    error_kind = "adapter_stack_too_deep"


class AdapterDuplicateError(AdapterError):
    """A mount of numbers another id already holds (409 ``adapter_already_mounted``)."""

    error_kind = "adapter_already_mounted"


def check_id(adapter_id: str, param: str = "id") -> str:
    """``adapter_id`` if it can name an adapter, else raise.

    Args:
        adapter_id (str): the proposed id.
        param (str): the request field named in the error. Default: ``"id"``.

    Returns:
        str: ``adapter_id``.

    Raises:
        AdapterError: it does not match :data:`ID_PATTERN` or is reserved.
    """
    if adapter_id in RESERVED_IDS:
        raise AdapterError(f"adapter id '{adapter_id}' is reserved", param)
    if not _ID.match(adapter_id):
        raise AdapterError(
            f"adapter id '{adapter_id}' must be 1-64 letters, digits, '.', '_' or '-' "
            "(starting with a letter or digit)",
            param,
        )
    return adapter_id


def parse_spec(spec: str, param: str = "adapter", max_stack: int | None = None) -> tuple[str, ...]:
    """The adapter ids a spec names, in order; ``()`` for ``"none"`` or ``""``.

    Args:
        spec (str): ``"id"``, ``"a+b"``, ``"a,b"`` or ``"none"``; spaces around
            ids are ignored.
        param (str): the request field named in errors. Default: ``"adapter"``.
        max_stack (int | None): the most ids a spec may stack
            (``--max-adapter-stack``); checked before anything else is. Default:
            ``None`` (any number).

    Returns:
        tuple[str, ...]: the ids, each at most once.

    Raises:
        AdapterStackError: more than ``max_stack`` ids.
        AdapterError: an empty id between separators, ``none`` stacked with
            others, or an id named twice.
    """
    text = spec.strip()
    if text in ("", NONE):
        return ()
    count = text.count("+") + text.count(",") + 1  # before splitting a body-sized spec
    if max_stack is not None and count > max_stack:
        raise stack_error(count, max_stack, param)
    ids = tuple(part.strip() for part in _SEPARATORS.split(text))
    if any(not part for part in ids):
        raise AdapterError(f"adapter spec '{spec}' has an empty id", param)
    if NONE in ids:
        raise AdapterError("'none' cannot be stacked with adapters", param)
    seen: set[str] = set()
    for adapter_id in ids:  # a set: linear in a spec of any length
        if adapter_id in seen:
            raise AdapterError(f"adapter '{adapter_id}' is named twice in '{spec}'", param)
        seen.add(adapter_id)
    return ids


def stack_error(count: int, max_stack: int, param: str = "adapter") -> AdapterStackError:
    """The error of a spec stacking ``count`` adapters past ``max_stack``."""
    return AdapterStackError(
        f"adapter spec stacks {count} adapters; at most {max_stack} may be stacked "
        "(--max-adapter-stack)",
        param,
    )

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


def parse_spec(spec: str, param: str = "adapter") -> tuple[str, ...]:
    """The adapter ids a spec names, in order; ``()`` for ``"none"`` or ``""``.

    Args:
        spec (str): ``"id"``, ``"a+b"``, ``"a,b"`` or ``"none"``; spaces around
            ids are ignored.
        param (str): the request field named in errors. Default: ``"adapter"``.

    Returns:
        tuple[str, ...]: the ids, each at most once.

    Raises:
        AdapterError: an empty id between separators, ``none`` stacked with
            others, or an id named twice.
    """
    text = spec.strip()
    if text in ("", NONE):
        return ()
    ids = tuple(part.strip() for part in _SEPARATORS.split(text))
    if any(not part for part in ids):
        raise AdapterError(f"adapter spec '{spec}' has an empty id", param)
    if NONE in ids:
        raise AdapterError("'none' cannot be stacked with adapters", param)
    twice = next((i for n, i in enumerate(ids) if i in ids[:n]), None)
    if twice is not None:
        raise AdapterError(f"adapter '{twice}' is named twice in '{spec}'", param)
    return ids

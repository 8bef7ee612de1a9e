"""Mounting a draft source at start-up, and the combinations refused then.

``mlxspec serve --draft-model PATH`` (mlx_lm.server's flag) mounts a draft
model; ``--draft-kind ngram`` mounts prompt lookup, no model;
``--num-draft-tokens N`` is the most drafts per row and step (mlx_lm.server's
default: 3); ``--fill strict`` (``MLXSPEC_FILL``) feeds grammar rows their
forced spans through the same verify step (:mod:`.fill`). A bad combination is
a :class:`SpeculationError` naming the flag, which ``serve`` prints as one
line (exit 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlxspec.engine.speculative.fill import Filler
from mlxspec.engine.speculative.ngram import NgramDrafts
from mlxspec.engine.speculative.speculator import Speculator

#: Drafts per row and step without ``--num-draft-tokens`` (mlx_lm.server's default).
DEFAULT_NUM_DRAFT = 3

#: The values of ``--draft-kind``.
DRAFT_KINDS = ("model", "ngram")


class SpeculationError(ValueError):
    """A draft source that cannot be mounted; ``str()`` names the flag."""


@dataclass(frozen=True)
class SpeculationOptions:
    """The draft source to mount.

    Args:
        kind (str): ``"model"`` or ``"ngram"``.
        num_draft (int): most drafts per row and step (``>= 1``).
        draft_model (str | None): the draft model's folder (kind ``"model"``).
            Default: ``None``.
    """

    kind: str
    num_draft: int = DEFAULT_NUM_DRAFT
    draft_model: str | None = None


def check_cache(model: Any, flag: str, feature: str = "speculative decoding") -> None:
    """Refuse a model whose KV cache a verify step cannot rewind per row
    (``feature`` names what needs it in the message).

    Raises:
        SpeculationError: a layer's cache is not mlx-lm's plain ``KVCache``
            (rotating, quantised or recurrent caches).
    """
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    kinds = {type(c).__name__ for c in make_prompt_cache(model) if type(c) is not KVCache}
    if kinds:
        raise SpeculationError(
            f"{flag}: {feature} needs plain attention KV caches; "
            f"this model has {', '.join(sorted(kinds))}"
        )


def mount(
    options: SpeculationOptions | None, model: Any, tokenizer: Any, fill: bool = False
) -> Speculator | None:
    """The speculator for ``options`` and ``fill`` on the target ``model``.

    Args:
        options (SpeculationOptions | None): the draft source to mount (``None``: none).
        model: the target mlx-lm model.
        tokenizer: its ``TokenizerWrapper``.
        fill (bool): feed grammar rows their forced spans (``--fill strict``).
            Default: ``False``.

    Returns:
        Speculator | None: the hook the batched decode step consults; ``None``
        when neither a draft source nor fill is asked for.

    Raises:
        SpeculationError: the combination cannot work (the message names the flag).
    """
    filler = None
    if fill:
        check_cache(model, "--fill", "token fast-forwarding")
        filler = Filler(tokenizer)
    if options is None:
        return None if filler is None else Speculator(None, DEFAULT_NUM_DRAFT, filler)
    spec = _source(options, model, tokenizer)
    spec.fill = filler
    return spec


def _source(options: SpeculationOptions, model: Any, tokenizer: Any) -> Speculator:
    """The speculator of ``options``' draft source (as :func:`mount`)."""
    if options.num_draft < 1:
        raise SpeculationError("--num-draft-tokens: must be at least 1")
    if options.kind == "ngram":
        if options.draft_model is not None:
            raise SpeculationError("--draft-kind: ngram mounts no draft model; drop --draft-model")
        check_cache(model, "--draft-kind")
        return Speculator(NgramDrafts(), options.num_draft)
    if options.kind != "model" or options.draft_model is None:
        raise SpeculationError("--draft-kind: model needs --draft-model PATH")
    check_cache(model, "--draft-model")
    from mlxspec.engine.speculative.draft_model import DraftModel

    return Speculator(
        DraftModel.load(Path(options.draft_model), model, tokenizer), options.num_draft
    )

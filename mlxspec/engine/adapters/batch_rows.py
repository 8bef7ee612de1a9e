"""The rows of a model call made inside mlx-lm's ``BatchGenerator``.

``BatchGenerator`` calls ``self.model(tokens, cache=...)`` from its prompt batch
(``PromptProcessingBatch.prompt``) and its decode batch
(``GenerationBatch._step``) and never tells the model which requests the rows
are. Both batch objects keep those requests' uids in row order in ``uids``, so
:class:`RowsModel`, the model the generator is given, reads the calling batch's
``uids`` and selects each row's adapters for that call
(:meth:`~.registry.AdapterRegistry.rows`). A batch runner of our own sets the
selection itself before its model calls and needs none of this.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from mlxspec.engine.adapters.registry import AdapterPick, AdapterRegistry


class RowsModel:
    """``model`` for a ``BatchGenerator``: each call selects its rows' adapters.

    Every other attribute is the model's (``layers``, ``make_cache``, ``parameters``).

    Args:
        model: the mlx-lm model.
        adapters (AdapterRegistry): the model's adapters.
        pick_of (Callable[[int], AdapterPick]): a generator uid's adapters.
    """

    def __init__(
        self, model: Any, adapters: AdapterRegistry, pick_of: Callable[[int], AdapterPick]
    ) -> None:
        object.__setattr__(self, "_model", model)
        object.__setattr__(self, "_adapters", adapters)
        object.__setattr__(self, "_pick_of", pick_of)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._model, name)

    def __call__(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if not self._adapters.active:
            return self._model(inputs, *args, **kwargs)
        uids = getattr(sys._getframe(1).f_locals.get("self"), "uids", None)
        if not isinstance(uids, list) or len(uids) != inputs.shape[0]:
            raise RuntimeError("cannot tell which requests the rows of this batched call are")
        with self._adapters.rows([self._pick_of(uid) for uid in uids]):
            return self._model(inputs, *args, **kwargs)

"""Speculative decoding inside the batched decode step (engine thread only).

A draft source proposes a few tokens per row (:mod:`.ngram`: prompt lookup
over the row's own tokens; :mod:`.draft_model`: a smaller model with its own
batch KV cache), the target model scores every row's drafts in one forward of
the batch (:meth:`~mlxspec.engine.loop.decode.DecodeBatch.step` through its
one ``speculator`` hook), and :mod:`.verify` keeps each row's longest accepted
prefix plus one token of the target's own (greedy: the drafts the target's
argmax agrees with; sampled: the speculative-sampling rule of Leviathan et al.
2023 / Chen et al. 2023). :class:`~.speculator.Speculator` ties them together
and keeps the counters (``usage.speculation``, ``/stats``, the Prometheus
histogram). :mod:`.fill` (``--fill strict``) gives rows with a grammar the
text it forces as their drafts, checked under the grammar's mask
(``usage.fill``).
"""

from mlxspec.engine.speculative.fill import FILL_MODES, FillCounts, Filler, fillable
from mlxspec.engine.speculative.mount import (
    DEFAULT_NUM_DRAFT,
    DRAFT_KINDS,
    SpeculationError,
    SpeculationOptions,
    mount,
)
from mlxspec.engine.speculative.ngram import NgramDrafts
from mlxspec.engine.speculative.speculator import (
    SpecCounts,
    SpecStats,
    Speculator,
    speculable,
)

__all__ = [
    "DEFAULT_NUM_DRAFT",
    "DRAFT_KINDS",
    "FILL_MODES",
    "FillCounts",
    "Filler",
    "NgramDrafts",
    "SpecCounts",
    "SpecStats",
    "SpeculationError",
    "SpeculationOptions",
    "fillable",
    "Speculator",
    "mount",
    "speculable",
]

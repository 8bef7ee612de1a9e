"""Jobs: fine-tune, quantize and dataset work run by subprocess runners.

A job is a SQLite row plus an append-only NDJSON event log (:mod:`.store`);
:mod:`.manager` runs each in a process group of its own (:mod:`.runner`), holding
the engine's execution lease for the kinds that use the accelerator; the kinds'
work is in :mod:`.finetune` (with :mod:`.datasets` and :mod:`.merge`),
:mod:`.quantize` and :mod:`.dataset`; :mod:`.roots` confines every path a client
names. Nothing here imports MLX at import time: the runners do, in their process.
"""

from mlxspec.jobs.manager import LEASE_KINDS, JobManager
from mlxspec.jobs.roots import JobRoots, OutsideRoots, hf_hub_cache, mlxspec_cache
from mlxspec.jobs.store import KINDS, STATUSES, TERMINAL, JobRow, JobStore

__all__ = [
    "KINDS", "LEASE_KINDS", "STATUSES", "TERMINAL", "JobManager", "JobRoots", "JobRow",
    "JobStore", "OutsideRoots", "hf_hub_cache", "mlxspec_cache",
]  # fmt: skip

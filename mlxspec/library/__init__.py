"""The local model library: what is on disk, what fits, downloads and disk reclaimed.

Pure functions over one scan of the Hugging Face hub cache (``huggingface_hub``'s
``scan_cache_dir``) and mlxspec's own caches (GGUF conversions, Whisper
checkpoints, adapters): :mod:`.scan` reads each model's ``config.json`` and
safetensors index (never tensor bytes), :mod:`.support` says whether mlx-lm or
mlx-vlm runs its architecture, :mod:`.assess` applies ``/fit``'s memory model to
it, :mod:`.registry` keeps the scan 30 s, :mod:`.gc` plans and executes the
removal of superseded snapshots, :mod:`.downloads` runs background
``snapshot_download`` with progress, :mod:`.paths` confines every path a client
names to the caches. No HTTP here: ``mlxspec/handlers/library/`` translates.
"""

from mlxspec.library.assess import Assessment, Machine, assess, current_machine
from mlxspec.library.downloads import DownloadBusy, Downloads
from mlxspec.library.gc import GcPlan, execute_gc, plan_gc
from mlxspec.library.paths import PathRefused, check_repo_id, hub_cache_dir, resolve_folder
from mlxspec.library.registry import Registry
from mlxspec.library.scan import LocalModel, scan

__all__ = [
    "Assessment",
    "DownloadBusy",
    "Downloads",
    "GcPlan",
    "LocalModel",
    "Machine",
    "PathRefused",
    "Registry",
    "assess",
    "check_repo_id",
    "current_machine",
    "execute_gc",
    "hub_cache_dir",
    "plan_gc",
    "resolve_folder",
    "scan",
]

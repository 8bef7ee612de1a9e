"""Where jobs may read and write: the allowed roots, and the default outputs.

Jobs run commands and read paths a client names, so every path of a submit body
is confined (house rule: off by default, confined when on). The roots are the
folders given with ``--jobs`` (repeatable), mlxspec's cache folder
(``MLXSPEC_CACHE_DIR``, else ``~/.cache/mlxspec``: the default outputs,
``adapters/``, ``datasets/``, ``exports/``, and the jobs' own state in ``jobs/``)
and the Hugging Face hub cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
``~/.cache/huggingface/hub``: the models a job reads and the repos quantize
writes). A path outside all of them, or one that does not resolve, is refused.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["JobRoots", "OutsideRoots", "hf_hub_cache", "mlxspec_cache"]


class OutsideRoots(ValueError):
    """A path a client named lies outside every allowed root (a 400)."""


def mlxspec_cache() -> Path:
    """mlxspec's cache folder: ``$MLXSPEC_CACHE_DIR``, else ``~/.cache/mlxspec``."""
    configured = os.environ.get("MLXSPEC_CACHE_DIR")
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "mlxspec"


def hf_hub_cache() -> Path:
    """The Hugging Face hub cache as ``huggingface_hub`` finds it now
    (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``)."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    if home := os.environ.get("HF_HOME"):
        return Path(home).expanduser() / "hub"
    return Path.home() / ".cache" / "huggingface" / "hub"


class JobRoots:
    """The folders jobs may touch.

    Args:
        extra (Sequence[str]): the ``--jobs`` folders.
    """

    def __init__(self, extra: Sequence[str]) -> None:
        self.extra = tuple(str(Path(e).expanduser().resolve()) for e in extra)

    def all(self) -> list[Path]:
        """Every root, resolved now (the caches' environment may change in a test)."""
        found = [Path(e) for e in self.extra]
        for cache in (mlxspec_cache(), hf_hub_cache()):
            try:
                found.append(cache.resolve())
            except (OSError, RuntimeError):
                continue
        return found

    def confine(self, path: str, field: str) -> Path:
        """``path`` resolved (symbolic links followed), if it lies in a root.

        Args:
            path (str): what the client sent (``~`` is expanded).
            field (str): the body field, for the message.

        Returns:
            Path: the resolved path (it need not exist).

        Raises:
            OutsideRoots: it lies outside every root, or cannot be resolved.
        """
        try:
            target = Path(path).expanduser().resolve()
        except (OSError, ValueError, RuntimeError) as e:
            raise OutsideRoots(f"{field}: cannot resolve {path!r}") from e
        if not any(target.is_relative_to(root) for root in self.all()):
            roots = ", ".join(str(r) for r in self.all())
            raise OutsideRoots(f"{field} {path!r} is outside the folders jobs may use ({roots})")
        return target

    @staticmethod
    def default_output(folder: str, prefix: str) -> Path:
        """``<mlxspec cache>/<folder>/<prefix>-<timestamp>`` (reference: ``adapter-<ts>``)."""
        stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{time.time_ns() % 1_000_000:06d}"
        return mlxspec_cache() / folder / f"{prefix}-{stamp}"

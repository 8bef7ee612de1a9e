"""The encoder-output cache: a vision tower's features for media already seen,
keyed by a hash of the processed pixels, so a follow-up turn about the same
screenshot does not run the tower again (reference, ``/stats``
``prompt_cache.object_hits`` / ``object_misses`` / ``object_restores``).

The features are opaque here (MLX arrays with ``nbytes``; nothing is imported);
the engine thread alone reads and writes the cache, ``/stats`` reads its
counters. Least recently used entries go first past :data:`MAX_ENTRIES` or
:data:`MAX_BYTES`.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

__all__ = ["MAX_BYTES", "MAX_ENTRIES", "EncoderCache", "media_digest"]

#: Most feature sets kept.
MAX_ENTRIES = 32
#: Most bytes of features kept.
MAX_BYTES = 512 * 1024 * 1024


def media_digest(arrays: Mapping[str, Any]) -> str:
    """A content hash of a prompt's processed media: every NumPy array the
    processor made but the attention mask (which follows the text), by name.

    Args:
        arrays (Mapping[str, numpy.ndarray]): the processor's outputs.

    Returns:
        str: a sha256 hex digest.
    """
    digest = hashlib.sha256()
    for name in sorted(arrays):
        if name == "attention_mask":
            continue
        value = arrays[name]
        digest.update(f"{name}\0{value.dtype}\0{value.shape}\0".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


class EncoderCache:
    """Feature sets by media digest, least recently used out first.

    Args:
        max_entries (int): entries kept. Default: :data:`MAX_ENTRIES`.
        max_bytes (int): bytes kept. Default: :data:`MAX_BYTES`.
    """

    def __init__(self, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES) -> None:
        self.max_entries, self.max_bytes = max_entries, max_bytes
        self._entries: OrderedDict[str, tuple[Any, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: str) -> Any | None:
        """The features kept under ``key`` (counted as a hit), or ``None`` (a miss)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry[0]

    def put(self, key: str, features: Any) -> None:
        """Keep ``features`` (an array or a tuple of arrays) under ``key``."""
        parts = features if isinstance(features, (tuple, list)) else (features,)
        size = sum(int(getattr(p, "nbytes", 0)) for p in parts)
        if size > self.max_bytes:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            self._bytes -= old[1] if old else 0
            self._entries[key] = (features, size)
            self._bytes += size
            while len(self._entries) > self.max_entries or self._bytes > self.max_bytes:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._bytes -= dropped

    def stats(self) -> dict[str, int]:
        """``object_hits``, ``object_misses``, ``object_restores`` (always 0: no
        SSD tier for features), ``object_entries`` and ``object_bytes``."""
        with self._lock:
            return {
                "object_hits": self.hits,
                "object_misses": self.misses,
                "object_restores": 0,
                "object_entries": len(self._entries),
                "object_bytes": self._bytes,
            }

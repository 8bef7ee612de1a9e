"""SSD tier of the prompt cache: durable KV snapshots in a directory.

Each snapshot is one safetensors file written by mlx-lm's
``save_prompt_cache``, with the namespace, token ids and a digest of the KV
cache in its metadata (:mod:`.ssd_snapshot`). A write goes to a hidden
temporary file named with the writer's pid, is fsync'ed, renamed over the
final name and the directory fsync'ed, so a crash leaves either the whole old
state or the whole new one (the reference's temp-file/fsync/rename boundary).

At start the index is rebuilt from the files' headers alone, without loading
any tensors. A snapshot whose header is unreadable or does not match the
file's size is deleted (one warning each, counted in ``corrupt``), as is one
without a digest (written by an older mlxspec: nothing shows it is intact); a
temporary file is deleted only when its writer's pid is not a live process on
this host, so another server's write in a shared directory is left alone.
Other files in the directory are never touched. A restore checks the digest
over the tensors it read before the cache is used; a mismatch is a miss.

Writes happen behind the engine on a writer thread, from a bounded queue of
pending snapshots; :meth:`SsdCache.flush` waits for the queue to drain (the
``POST /admin/cache/flush`` route and shutdown call it).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlxspec.engine.caches.ssd_snapshot import (
    DIGEST_KEY,
    SUFFIX,
    SnapshotError,
    is_snapshot_name,
    kv_digest,
    load_checked,
    parse_header,
    read_snapshot_header,
    snapshot_name,
    temp_name,
    temp_writer_pid,
    writer_alive,
)

__all__ = ["DEFAULT_SSD_CACHE_BYTES", "FLUSH_TIMEOUT_S", "SsdCache", "read_snapshot_header"]

log = logging.getLogger("mlxspec.engine.caches.ssd_cache")

#: Default disk budget for snapshots, bytes (``--ssd-cache-bytes``).
DEFAULT_SSD_CACHE_BYTES = 16 << 30

#: How long a flush (route or shutdown) waits for the writer, seconds: the
#: reference's shutdown default.
FLUSH_TIMEOUT_S = 120.0

#: Most snapshots waiting for the writer; the oldest is dropped beyond this.
MAX_PENDING = 64


class SsdCache:
    """Durable prompt-cache snapshots under ``directory``.

    Args:
        directory (Path): where snapshots live; created if missing.
        max_bytes (int): disk budget; the oldest snapshots are deleted beyond
            it. Default: :data:`DEFAULT_SSD_CACHE_BYTES`.
    """

    def __init__(self, directory: Path, max_bytes: int = DEFAULT_SSD_CACHE_BYTES) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.directory.mkdir(parents=True, exist_ok=True)
        #: (namespace, tokens) -> (path, bytes), oldest first.
        self._index: OrderedDict[tuple, tuple[Path, int]] = OrderedDict()
        self._pending: OrderedDict[tuple, list[Any]] = OrderedDict()
        #: Snapshots whose write failed; the next flush retries them.
        self._failed: OrderedDict[tuple, list[Any]] = OrderedDict()
        #: Snapshots whose files vanished from the directory while neither RAM
        #: nor a longer snapshot on disk still covers them (reported by flush).
        self._missing: set[tuple] = set()
        self._cond = threading.Condition()
        self._writing = False
        self._counts = dict.fromkeys(
            (
                "restores",
                "spills",
                "dropped_spills",
                "failed_spills",
                "corrupt",
                "restore_ms_last",
            ),
            0,
        )
        self._rebuild_index()
        self._writer = threading.Thread(target=self._write_loop, name="mlxspec-ssd", daemon=True)
        self._writer.start()

    def _rebuild_index(self) -> None:
        """Index the trusted snapshots in the directory, oldest first, and
        delete the damaged, digest-less and abandoned temporary files."""
        found: list[tuple[float, Path, tuple, int]] = []
        legacy = 0
        for path in self.directory.iterdir():
            if (pid := temp_writer_pid(path.name)) is not None:
                if not writer_alive(pid):  # left by a crash
                    _remove(path)
                continue
            if not is_snapshot_name(path.name):
                continue  # not ours: never touched
            try:
                stat = path.stat()
                header = parse_header(path)
            except FileNotFoundError:
                continue  # deleted meanwhile (another server's disk budget)
            except SnapshotError as exc:
                log.warning("SSD snapshot %s is unreadable (%s); deleting it", path, exc)
                self._counts["corrupt"] += 1
                _remove(path)
                continue
            if header.digest is None:
                legacy += 1
                _remove(path)
                continue
            found.append((stat.st_mtime, path, (header.namespace, header.tokens), stat.st_size))
        if legacy:
            log.warning(
                "deleted %d SSD snapshots without a KV digest (written by an older mlxspec)", legacy
            )
        for _, path, key, size in sorted(found, key=lambda f: f[0]):
            self._index[key] = (path, size)

    # Engine thread.
    def enqueue(self, namespace: tuple, tokens: tuple[int, ...], cache: list[Any]) -> None:
        """Schedule a snapshot for the writer thread (engine thread).

        A pending snapshot that is a prefix of this one is superseded, and one
        already on disk is not written again; beyond :data:`MAX_PENDING` the
        oldest pending snapshot is dropped (``dropped_spills``).

        Args:
            namespace (tuple): the cache namespace.
            tokens (tuple[int, ...]): the token ids ``cache`` holds.
            cache (list): per-layer mlx-lm caches, already evaluated.
        """
        key = (tuple(namespace), tokens)
        with self._cond:
            if key in self._index:
                return
            for other in [k for k in self._pending if k[0] == key[0]]:
                if tokens[: len(other[1])] == other[1]:
                    del self._pending[other]
            self._pending[key] = cache
            self._missing.discard(key)
            while len(self._pending) > MAX_PENDING:
                self._pending.popitem(last=False)
                self._counts["dropped_spills"] += 1
            self._cond.notify_all()

    def restore(
        self, namespace: tuple, prompt: Sequence[int], better_than: int
    ) -> tuple[tuple[int, ...], list[Any]] | None:
        """Load the snapshot sharing the longest prefix with ``prompt``, if it
        beats ``better_than`` tokens (engine thread: loading creates MLX arrays).

        Args:
            namespace (tuple): the request's cache namespace.
            prompt (Sequence[int]): the prompt token ids.
            better_than (int): tokens the RAM tier already covers.

        The tensors are read and checked against the snapshot's digest
        (:func:`~.ssd_snapshot.kv_digest`) before the cache is returned. A
        snapshot that cannot be read or does not match (a damaged, truncated
        or digest-less file) is a miss: it is dropped from the index, deleted
        and counted in ``corrupt``, so the next request that keeps these
        tokens writes it afresh from its own prefill, and the next best
        snapshot is tried.

        Returns:
            tuple | None: ``(tokens, cache)``, or ``None`` when no readable
            snapshot beats ``better_than``.
        """
        from mlxspec.engine.caches.kv import common_prefix

        with self._cond:
            scored = [
                (common_prefix(k[1], prompt), k, path)
                for k, (path, _) in self._index.items()
                if k[0] == tuple(namespace)
            ]
        for shared, key, path in sorted(scored, key=lambda s: s[0], reverse=True):
            if shared <= better_than:
                return None
            started = time.perf_counter()
            try:
                cache = load_checked(path, *key)
            except Exception as exc:  # a damaged file is a miss, not a failed request
                log.warning("SSD snapshot %s is damaged (%s); deleting it", path, _reason(exc))
                log.debug("SSD snapshot %s", path, exc_info=True)
                self._forget(key, path)
                continue
            with self._cond:
                self._counts["restores"] += 1
                self._counts["restore_ms_last"] = round((time.perf_counter() - started) * 1000)
            return key[1], cache
        return None

    def _forget(self, key: tuple, path: Path) -> None:
        """Drop a damaged snapshot from the index and the disk."""
        with self._cond:
            if self._index.get(key, (None,))[0] == path:
                del self._index[key]
            self._counts["corrupt"] += 1
        _remove(path)

    # Writer thread.
    def _write_loop(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: bool(self._pending))
                key, cache = self._pending.popitem(last=False)
                self._writing = True
            try:
                path, size = self._write(key, cache)
            except Exception:
                log.warning("SSD snapshot write failed", exc_info=True)
                with self._cond:
                    self._counts["failed_spills"] += 1
                    self._failed[key] = cache
                    while len(self._failed) > MAX_PENDING:
                        self._failed.popitem(last=False)
                        self._counts["dropped_spills"] += 1
            else:
                with self._cond:
                    self._index[key] = (path, size)
                    self._counts["spills"] += 1
                    self._trim_disk()
            finally:
                with self._cond:
                    self._writing = False
                    self._cond.notify_all()

    def _write(self, key: tuple, cache: list[Any]) -> tuple[Path, int]:
        """Write one snapshot atomically; returns its path and size."""
        from mlx_lm.models.cache import save_prompt_cache

        name = snapshot_name(*key)
        self.directory.mkdir(parents=True, exist_ok=True)  # deleted while serving
        final = self.directory / (name + SUFFIX)
        temp = self.directory / temp_name(name, os.getpid())
        metadata = {
            "mlxspec_namespace": json.dumps(list(key[0])),
            "mlxspec_tokens": json.dumps(list(key[1])),
            DIGEST_KEY: kv_digest(key[0], key[1], cache),
        }
        try:
            save_prompt_cache(str(temp), cache, metadata)
            with temp.open("rb") as f:
                os.fsync(f.fileno())
            os.replace(temp, final)
        finally:
            temp.unlink(missing_ok=True)
        dir_fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return final, final.stat().st_size

    def _trim_disk(self) -> None:
        """Delete the oldest snapshots beyond the disk budget (lock held)."""
        total = sum(size for _, size in self._index.values())
        while total > self.max_bytes and len(self._index) > 1:
            _, (path, size) = self._index.popitem(last=False)
            path.unlink(missing_ok=True)
            total -= size

    # Any thread.
    def holds(self, key: tuple) -> bool:
        """Whether a written snapshot of ``(namespace, tokens)`` is in the index."""
        with self._cond:
            return key in self._index

    def flush(
        self, timeout: float, in_ram: Callable[[tuple], list[Any] | None] | None = None
    ) -> dict[str, Any]:
        """Retry failed snapshots, write again those whose files vanished, and
        wait up to ``timeout`` seconds for every pending one to be written.

        A snapshot whose file is gone from the directory (deleted by hand, or
        the directory itself) leaves the index; it is written again from
        ``in_ram`` when the RAM tier still holds its tokens, else it counts in
        ``missingSnapshots`` on this and every later flush until a snapshot
        on disk covers its tokens again (the reference: retrying does not turn
        a missing snapshot into a durable one).

        Args:
            timeout (float): seconds to wait for the writer.
            in_ram (Callable | None): ``(namespace, tokens) -> cache | None``,
                the RAM tier's kept cache for a key. Default: ``None`` (none).

        Returns:
            dict: the reference's flush report; ``durable`` is true only when
            nothing is pending or missing and no write failed during this
            flush (a snapshot that fails again stays pending for the next flush).
        """
        started = time.perf_counter()
        with self._cond:
            vanished = [k for k, (path, _) in self._index.items() if not path.exists()]
            for key in vanished:
                del self._index[key]
        rewrite = {key: in_ram(key) if in_ram is not None else None for key in vanished}
        with self._cond:
            for key, cache in rewrite.items():
                if cache is not None and key not in self._index:
                    self._pending.setdefault(key, cache)
                elif cache is None:
                    self._missing.add(key)
            failed0, spills0 = self._counts["failed_spills"], self._counts["spills"]
            self._pending.update(self._failed)
            self._failed.clear()
            self._cond.notify_all()
            self._cond.wait_for(lambda: not self._pending and not self._writing, timeout)
            failed = self._counts["failed_spills"] - failed0
            pending = len(self._pending) + len(self._failed)
            self._missing = {k for k in self._missing if not self._covered(k)}
            missing = len(self._missing)
            report = {
                "durable": pending == 0 and failed == 0 and missing == 0,
                "flushedSnapshots": self._counts["spills"] - spills0,
                "missingSnapshots": missing,
                "pendingSnapshots": pending,
                "pendingSpills": pending,
                "pendingSpillBytes": self._pending_bytes(),
                "droppedSpills": self._counts["dropped_spills"],
                "failedSpills": failed,
                "elapsedMs": round((time.perf_counter() - started) * 1000),
                "entries": len(self._index),
                "longest_durable_prefix_tokens": self._longest(),
            }
        return report

    @staticmethod
    def empty_flush_report() -> dict[str, Any]:
        """The flush report when there is no SSD tier: nothing pending, no entries."""
        return {
            "durable": True,
            "flushedSnapshots": 0,
            "missingSnapshots": 0,
            "pendingSnapshots": 0,
            "pendingSpills": 0,
            "pendingSpillBytes": 0,
            "droppedSpills": 0,
            "failedSpills": 0,
            "elapsedMs": 0,
            "entries": 0,
            "longest_durable_prefix_tokens": 0,
        }

    def _covered(self, key: tuple) -> bool:
        """Whether a snapshot in the index (on disk: :meth:`flush` drops the
        vanished ones first) holds ``key``'s tokens, or more tokens starting
        with them (lock held)."""
        namespace, tokens = key
        return any(k[0] == namespace and k[1][: len(tokens)] == tokens for k in self._index)

    def _pending_bytes(self) -> int:
        waiting = [*self._pending.values(), *self._failed.values()]
        return sum(c.nbytes for cache in waiting for c in cache)

    def _longest(self) -> int:
        return max((len(k[1]) for k in self._index), default=0)

    def stats(self) -> dict[str, Any]:
        """Counters for ``GET /stats``' ``ssd_cache`` section.

        Returns:
            dict: the directory, ``entries`` and ``bytes`` on disk, the budget,
            pending writes, and the counters ``restores``, ``spills``,
            ``dropped_spills``, ``failed_spills``, ``corrupt`` (snapshots
            deleted as damaged: at start-up or by a failed digest check) and
            ``restore_ms_last`` (the last restore, its digest check included).
        """
        with self._cond:
            return {
                "dir": str(self.directory),
                "entries": len(self._index),
                "bytes": sum(size for _, size in self._index.values()),
                "max_bytes": self.max_bytes,
                "pending_snapshots": len(self._pending) + len(self._failed),
                "pending_spill_bytes": self._pending_bytes(),
                "longest_durable_prefix_tokens": self._longest(),
                **self._counts,
            }


def _reason(exc: BaseException) -> str:
    """One line for a warning: the error's message, or its type when it has none."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _remove(path: Path) -> None:
    """Delete ``path`` if it is still there; a failure only logs."""
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.warning("cannot delete %s: %s", path, exc.strerror or exc)

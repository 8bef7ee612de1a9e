"""Model downloads in the background, with bytes, files and a rolling rate.

Through ``huggingface_hub``: a dry-run ``snapshot_download`` lists the files
the patterns keep (:data:`MODEL_FILES`: weights, config, tokenizer, templates)
with their sizes, each is fetched with ``hf_hub_download`` (resumable: a
``.incomplete`` blob continues with a ``Range`` request), then
``snapshot_download`` writes the ref and returns the snapshot folder. The
endpoint (``HF_ENDPOINT``) and cache are read per download. The last
:data:`KEEP` downloads are kept, a failed one with its error.
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mlxspec.library.paths import check_repo_id, hub_cache_dir

#: Files a model needs (reference, issue 30: weights, config, tokenizer, templates).
MODEL_FILES = (
    "*.json",
    "*.safetensors",
    "*.jinja",
    "*.model",
    "*.tiktoken",
    "*.txt",
    "tokenizer*",
)
#: Downloads ``/downloads`` lists (the reference's last five).
KEEP = 5
#: Seconds of the rolling rate window (reference: "rolling ~5 s window").
RATE_WINDOW_S = 5.0


class DownloadBusy(RuntimeError):
    """A download of the repo is already running (the handlers' 409)."""


@dataclass
class Download:
    """One download's progress (``GET /downloads``' row).

    ``huggingface_hub`` reports a file's bytes per 10 MB read, so while a file
    arrives its count is also read from the size of its ``.incomplete`` blob
    (:meth:`live_bytes`).
    """

    repo_id: str
    state: str = "active"
    current_file: str | None = None
    received_bytes: int = 0
    total_bytes: int = 0
    files_done: int = 0
    files_total: int = 0
    started_at: int = field(default_factory=lambda: int(time.time()))
    finished_at: int | None = None
    error: str | None = None
    path: str | None = None
    blobs: Path | None = None
    file_counted: int = 0
    samples: deque = field(default_factory=lambda: deque(maxlen=512), repr=False)

    def add(self, n: int) -> None:
        """``n`` more bytes of the current file arrived."""
        self.file_counted += n
        self._sample()

    def file_done(self, size: int) -> None:
        """The current file is complete (``size`` bytes)."""
        self.received_bytes += size
        self.file_counted = 0
        self.files_done += 1
        self._sample()

    def live_bytes(self) -> int:
        """Bytes received so far, the current file's partial blob included."""
        partial = self.file_counted
        if self.state == "active" and self.current_file and self.blobs is not None:
            try:
                sizes = [p.stat().st_size for p in self.blobs.glob("*.incomplete")]
            except OSError:
                sizes = []
            partial = max([partial, *sizes])
        return self.received_bytes + partial

    def _sample(self) -> None:
        now = time.monotonic()
        self.samples.append((now, self.live_bytes()))
        while self.samples and now - self.samples[0][0] > RATE_WINDOW_S:
            self.samples.popleft()

    def rate(self) -> float:
        """Bytes per second over the last :data:`RATE_WINDOW_S` seconds."""
        if self.state != "active":
            return 0.0
        self._sample()
        if len(self.samples) < 2:
            return 0.0
        (t0, b0), (t1, b1) = self.samples[0], self.samples[-1]
        return round(max(0, b1 - b0) / max(1e-3, t1 - t0), 1)

    def json(self) -> dict[str, Any]:
        """The row in the reference's fields."""
        row = {
            "repo_id": self.repo_id,
            "state": self.state,
            "current_file": self.current_file,
            "received_bytes": self.live_bytes(),
            "total_bytes": self.total_bytes,
            "files_done": self.files_done,
            "files_total": self.files_total,
            "bytes_per_sec": self.rate(),
            "started_at": self.started_at,
            "finished_at": self.finished_at,
        }
        if self.error is not None:
            row["error"] = self.error
        return row


def _progress_class(download: Download) -> type:
    """A tqdm stand-in for ``hf_hub_download`` counting into ``download``."""

    class Progress:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            download.add(int(kwargs.get("initial") or 0))  # a resumed file's bytes

        def __enter__(self) -> Progress:
            return self

        def __exit__(self, *exc: object) -> None:
            return None

        def update(self, n: float | None = 1) -> None:
            download.add(int(n or 0))

        def close(self) -> None:
            return None

        def update_transfer(self, n: float | None = 1) -> None:
            return None

        def set_postfix_str(self, *args: Any, **kwargs: Any) -> None:
            return None

        def set_transfer_postfix_str(self, *args: Any, **kwargs: Any) -> None:
            return None

    return Progress


def fetch(download: Download, patterns: Sequence[str], cache: Path | None = None) -> str:
    """Download ``download.repo_id`` into the hub cache, updating ``download``.

    Args:
        download (Download): the progress record to update.
        patterns (Sequence[str]): ``allow_patterns``.
        cache (Path | None): the hub cache. Default: :func:`~.paths.hub_cache_dir`.

    Returns:
        str: the snapshot folder.

    Raises:
        Exception: whatever ``huggingface_hub`` raises (offline, not found, HTTP).
    """
    from huggingface_hub import hf_hub_download, snapshot_download

    kw: dict[str, Any] = {
        "repo_id": download.repo_id,
        "cache_dir": str(cache or hub_cache_dir()),
        "endpoint": os.environ.get("HF_ENDPOINT") or None,
        "allow_patterns": list(patterns),
    }
    plan = snapshot_download(**kw, dry_run=True)
    folder = "models--" + download.repo_id.replace("/", "--")
    download.blobs = Path(kw["cache_dir"]) / folder / "blobs"
    download.files_total = len(plan)
    download.total_bytes = sum(int(f.file_size or 0) for f in plan)
    progress = _progress_class(download)
    for item in plan:
        download.current_file = item.filename
        if item.will_download:
            hf_hub_download(
                download.repo_id,
                item.filename,
                revision=item.commit_hash,
                cache_dir=kw["cache_dir"],
                endpoint=kw["endpoint"],
                tqdm_class=progress,
            )
        download.file_done(int(item.file_size or 0))
    download.current_file = None
    return str(snapshot_download(**kw))


def describe_error(exc: BaseException) -> str:
    """A one-line reason a download failed, naming no internals."""
    name = type(exc).__name__
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else name
    if "offline" in name.lower() or "offline" in text.lower():
        return f"offline: {text}"
    return f"{name}: {text}"[:500]


class Downloads:
    """The server's (or the CLI's) downloads.

    Args:
        on_done (Callable[[], None] | None): called after each download ends
            (the registry's ``invalidate``).
        fetcher (Callable): :func:`fetch`, or a test's stand-in.
    """

    def __init__(
        self,
        on_done: Callable[[], None] | None = None,
        fetcher: Callable[[Download, Sequence[str]], str] = fetch,
    ) -> None:
        self.on_done, self.fetcher = on_done, fetcher
        self._lock = threading.Lock()
        self._items: list[Download] = []

    def _claim(self, repo_id: str) -> Download:
        check_repo_id(repo_id)
        with self._lock:
            if any(d.repo_id == repo_id and d.state == "active" for d in self._items):
                raise DownloadBusy(f"a download for {repo_id} is already in progress")
            self._items = [d for d in self._items if d.repo_id != repo_id]
            download = Download(repo_id)
            self._items.append(download)
            del self._items[: max(0, len(self._items) - KEEP)]
            return download

    def run(self, repo_id: str, patterns: Sequence[str] = MODEL_FILES) -> Download:
        """Download ``repo_id`` now (blocks); the record tells how it ended.

        Raises:
            PathRefused: an invalid repo id.
            DownloadBusy: one is already running.
        """
        download = self._claim(repo_id)
        self._work(download, patterns)
        return download

    def start(self, repo_id: str, patterns: Sequence[str] = MODEL_FILES) -> Download:
        """Start downloading ``repo_id`` on a thread and return at once.

        Raises:
            PathRefused: an invalid repo id.
            DownloadBusy: one is already running.
        """
        download = self._claim(repo_id)
        name = f"mlxspec-download-{repo_id}"
        threading.Thread(
            target=self._work, args=(download, patterns), name=name, daemon=True
        ).start()
        return download

    def _work(self, download: Download, patterns: Sequence[str]) -> None:
        try:
            download.path = self.fetcher(download, patterns)
            download.state = "done"
        except Exception as exc:  # every failure is the row's error, never the server's
            download.error = describe_error(exc)
            download.state = "error"
        finally:
            download.current_file = None
            download.finished_at = int(time.time())
            if self.on_done is not None:
                self.on_done()

    def listing(self) -> list[dict[str, Any]]:
        """``GET /downloads``' rows, newest first."""
        with self._lock:
            return [d.json() for d in reversed(self._items)]

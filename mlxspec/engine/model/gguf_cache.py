"""Where a GGUF file's MLX conversion lives: one folder per file content.

A conversion folder is named by the sha256 of the GGUF's bytes and the
converter version, ``<root>/<sha256[:24]>-v<CONVERTER_VERSION>``, so the same
file installed at another path (every virtualenv holds its own copy of the
embedded model's wheel) reuses one conversion instead of adding ~100 MB each
time. Hashing reads the whole file (about 0.15 s for the 90 MB embedded model,
about 1.5 s per GB), so each file version's digest is remembered under
``<root>/.digests/``: a file already seen at the same path, untouched since,
is not read again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from mlxspec.engine.model.gguf import CONVERTER_VERSION, MARKER_FILE, GGUFError, convert_gguf
from mlxspec.engine.model.progress import progress

__all__ = [
    "atomic_file",
    "content_digest",
    "conversion_folder",
    "convert_once",
    "prune_older_conversions",
    "remember_digest",
]

logger = logging.getLogger("mlxspec.engine")

#: Hex digits of the content sha256 in a folder name (96 bits: no collisions).
PREFIX_HEX = 24
_SHA256_RE = re.compile(r"[0-9a-f]{64}")
_FOLDER_RE = re.compile(rf"([0-9a-f]{{{PREFIX_HEX}}})-v(\d+)")


def content_digest(gguf: Path, root: Path) -> str:
    """The sha256 of ``gguf``'s bytes; read from ``root``'s memo when this file
    version was hashed before (:func:`remember_digest`).

    Args:
        gguf (Path): the GGUF file.
        root (Path): the conversion cache folder (memos live in ``root/.digests``).

    Returns:
        str: 64 lowercase hex digits.

    Raises:
        GGUFError: if the file cannot be read.
    """
    try:
        memo = _memo_path(gguf, root)
        known = memo.read_text().strip() if memo.is_file() else ""
        if _SHA256_RE.fullmatch(known):
            return known
        digest = hashlib.sha256()
        size = gguf.stat().st_size
        with progress(f"hashing {gguf.name} ({size >> 20} MiB)", size) as advance:
            with gguf.open("rb") as f:
                while chunk := f.read(1 << 20):
                    digest.update(chunk)
                    advance(len(chunk))
    except OSError as e:
        reason = (e.strerror or str(e)).lower()
        raise GGUFError(f"cannot read GGUF file {gguf}: {reason}") from e
    return digest.hexdigest()


def _memo_path(gguf: Path, root: Path) -> Path:
    """The memo of this file version: keyed by the resolved path, size, inode and
    modification and change times (``ctime`` moves on any rewrite and cannot be
    set back), so an edited file is hashed again."""
    path = gguf.resolve()
    st = path.stat()
    stamp = f"{path}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
    return root / ".digests" / hashlib.sha256(stamp.encode()).hexdigest()[:32]


def remember_digest(gguf: Path, root: Path, digest: str) -> None:
    """Remember ``digest`` for this version of ``gguf`` (best effort: a memo that
    cannot be written only costs a re-hash next time)."""
    try:
        _write_atomically(_memo_path(gguf, root), digest)
    except OSError as e:
        logger.debug("cannot remember the digest of %s: %s", gguf, e)


@contextlib.contextmanager
def atomic_file(path: Path, mode: str = "w") -> Iterator[IO[Any]]:
    """Write ``path`` through a temporary file beside it, renamed over ``path``
    when the block ends without an exception (removed otherwise), so readers see
    the old file or the whole new one, never a part.

    Args:
        path (Path): the destination (its folder is created).
        mode (str): ``"w"`` or ``"wb"``. Default: ``"w"``.

    Yields:
        IO: the open temporary file.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, mode) as f:
            yield f
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_atomically(path: Path, text: str) -> None:
    with atomic_file(path) as f:
        f.write(text)


def conversion_folder(root: Path, digest: str) -> Path:
    """``root/<digest[:24]>-v<CONVERTER_VERSION>``: the conversion of that content."""
    return root / f"{digest[:PREFIX_HEX]}-v{CONVERTER_VERSION}"


def convert_once(gguf: Path, root: Path) -> Path:
    """Return ``gguf``'s conversion folder under ``root``, converting only if
    no conversion of the same content by this converter version exists.

    The folder is published atomically by :func:`convert_gguf`; conversions of
    the same content by older converter versions are then removed
    (:func:`prune_older_conversions`).

    Args:
        gguf (Path): the GGUF file.
        root (Path): the conversion cache folder, e.g. ``~/.cache/mlxspec/gguf``.

    Returns:
        Path: a folder ``mlx_lm.load`` reads.

    Raises:
        GGUFError: if the file cannot be read or converted.
        OSError: if writing the folder fails (e.g. disk full).
    """
    digest = content_digest(gguf, root)
    out = conversion_folder(root, digest)
    if (out / "config.json").is_file():
        logger.info("using GGUF conversion cached in %s", out)
    else:
        logger.info("converting GGUF %s once into %s", gguf, out)
        convert_gguf(gguf, out, source_sha256=digest)
    remember_digest(gguf, root, digest)
    prune_older_conversions(root, digest)
    return out


def prune_older_conversions(root: Path, digest: str) -> list[Path]:
    """Delete conversions of the same content made by older converter versions.

    Only folders this module names (``<digest[:24]>-v<k>``, k below
    :data:`CONVERTER_VERSION`) whose marker file records the same full
    ``sha256`` and that version are removed; anything else under ``root`` is
    left alone.

    Args:
        root (Path): the conversion cache folder.
        digest (str): the content sha256 whose older conversions go.

    Returns:
        list[Path]: the folders removed.
    """
    removed = []
    for folder in root.glob(f"{digest[:PREFIX_HEX]}-v*"):
        match = _FOLDER_RE.fullmatch(folder.name)
        if match is None or int(match[2]) >= CONVERTER_VERSION:
            continue
        try:
            marker = json.loads((folder / MARKER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if (
            isinstance(marker, dict)
            and marker.get("sha256") == digest
            and marker.get("converter_version") == int(match[2])
        ):
            shutil.rmtree(folder, ignore_errors=True)
            logger.info("removed %s, converted by an older mlxspec", folder)
            removed.append(folder)
    return removed

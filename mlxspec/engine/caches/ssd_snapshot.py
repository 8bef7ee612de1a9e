"""The SSD tier's file format: names, headers and the KV digest of a snapshot.

A snapshot is a safetensors file written by mlx-lm's ``save_prompt_cache``
with three entries of ours in its metadata: the cache namespace, the token ids
and :func:`kv_digest`, a BLAKE2b-256 of everything ``load_prompt_cache`` turns
back into a KV cache. The digest is checked on restore after the tensors are
read and before the cache is used; the header is checked at start-up against
the file's size (safetensors format: an 8-byte little-endian header length, a
JSON header, then the tensor bytes its ``data_offsets`` cover exactly).

The digest guards against damage (a flipped bit, a torn or truncated write),
not against someone who may write the directory: it is not a MAC.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: File name ending of snapshots and their temporary files.
SUFFIX = ".safetensors"

#: Largest safetensors header read, bytes: the ``safetensors`` crate's
#: ``MAX_HEADER_SIZE`` (its reader refuses longer headers too).
MAX_HEADER_BYTES = 100_000_000

#: Metadata key of the digest (``save_prompt_cache`` stores it as ``0.<key>``).
DIGEST_KEY = "mlxspec_digest"

_SNAPSHOT = re.compile(r"[0-9a-f]{32}" + re.escape(SUFFIX))
_TEMP = re.compile(r"\.[0-9a-f]{32}\.(\d+)\.tmp" + re.escape(SUFFIX))


class SnapshotError(ValueError):
    """A snapshot file that cannot be trusted: unreadable, inconsistent with its
    size, not ours, or whose tensors do not match their digest."""


@dataclass(frozen=True)
class SnapshotHeader:
    """What a snapshot's safetensors header says.

    Args:
        namespace (tuple): the cache namespace.
        tokens (tuple[int, ...]): the token ids the KV cache holds.
        digest (str | None): :func:`kv_digest` as written; ``None`` in files
            written by mlxspec before digests existed.
    """

    namespace: tuple
    tokens: tuple[int, ...]
    digest: str | None


def snapshot_name(namespace: tuple, tokens: tuple[int, ...]) -> str:
    """The file name stem of the snapshot of ``(namespace, tokens)``: 32 hex digits."""
    payload = json.dumps([list(namespace), list(tokens)]).encode()
    return hashlib.sha256(payload).hexdigest()[:32]


def temp_name(stem: str, pid: int) -> str:
    """The temporary file name a writer with process id ``pid`` uses for ``stem``."""
    return f".{stem}.{pid}.tmp{SUFFIX}"


def is_snapshot_name(name: str) -> bool:
    """Whether ``name`` is a snapshot's final file name (:func:`snapshot_name`)."""
    return _SNAPSHOT.fullmatch(name) is not None


def temp_writer_pid(name: str) -> int | None:
    """The writer's process id in a temporary file name, or ``None`` when
    ``name`` is not one of ours (:func:`temp_name`)."""
    found = _TEMP.fullmatch(name)
    return int(found.group(1)) if found else None


def writer_alive(pid: int) -> bool:
    """Whether the process that writes a temporary file may still be writing it.

    Our own pid is dead: the caller runs before its writer thread starts, so
    such a file was left by an earlier process that had the same pid (a
    container restarted). ``os.kill(pid, 0)`` delivers no signal; a
    ``PermissionError`` means the process exists under another user. Only
    processes on this host can be seen.

    Args:
        pid (int): the writer's process id, from :func:`temp_writer_pid`.

    Returns:
        bool: True if the process exists.
    """
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except (OverflowError, OSError):
        return False
    return True


def parse_header(path: Path) -> SnapshotHeader:
    """Read and check a snapshot's safetensors header, not its tensors.

    The header length must fit in the file and :data:`MAX_HEADER_BYTES`, the
    header must be a JSON object, and the tensors' ``data_offsets`` must lie
    in the data section and end exactly at the end of the file (the
    safetensors format's own validation), so a truncated file fails here.

    Args:
        path (Path): a snapshot file.

    Returns:
        SnapshotHeader: its namespace, tokens and digest.

    Raises:
        FileNotFoundError: the file vanished (another server deleted it).
        SnapshotError: for anything else that makes the file unusable.
    """
    try:
        with path.open("rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise SnapshotError(f"{size} bytes, shorter than a safetensors header")
            (length,) = struct.unpack("<Q", f.read(8))
            if length > min(size - 8, MAX_HEADER_BYTES):
                raise SnapshotError(f"header length {length} does not fit in {size} bytes")
            header = json.loads(f.read(length))
    except (FileNotFoundError, SnapshotError):
        raise
    except OSError as exc:
        raise SnapshotError(f"cannot read it: {exc.strerror or exc}") from exc
    except (ValueError, RecursionError) as exc:  # JSON, UTF-8
        raise SnapshotError("the header is not JSON") from exc
    if not isinstance(header, dict):
        raise SnapshotError("the header is not a JSON object")
    _check_offsets(header, size - 8 - length)
    try:
        meta = header["__metadata__"]
        # save_prompt_cache flattens [metadata, classes, scalars]: ours is under "0."
        namespace = tuple(json.loads(meta["0.mlxspec_namespace"]))
        tokens = tuple(int(t) for t in json.loads(meta["0.mlxspec_tokens"]))
        digest = meta.get(f"0.{DIGEST_KEY}")
    except (KeyError, TypeError, ValueError, RecursionError) as exc:
        raise SnapshotError("no mlxspec namespace and tokens in its metadata") from exc
    if digest is not None and not isinstance(digest, str):
        raise SnapshotError("the digest is not a string")
    return SnapshotHeader(namespace, tokens, digest)


def _check_offsets(header: dict, data_bytes: int) -> None:
    """Every tensor's ``[begin, end)`` lies in the data section and the last
    one ends where the file does (safetensors' ``validate``)."""
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_bytes
        ):
            raise SnapshotError(f"tensor {name!r} lies outside the file's {data_bytes} data bytes")
        end = max(end, offsets[1])
    if end != data_bytes:
        raise SnapshotError(f"the tensors cover {end} of the file's {data_bytes} data bytes")


def read_snapshot_header(path: Path) -> tuple[tuple, tuple[int, ...]] | None:
    """The ``(namespace, tokens)`` a snapshot file holds, from its safetensors
    header only (:func:`parse_header`); ``None`` for a file that is not a
    readable snapshot of ours.

    Args:
        path (Path): a ``.safetensors`` file.

    Returns:
        tuple | None: ``(namespace, tokens)``, or ``None``.
    """
    try:
        header = parse_header(path)
    except (FileNotFoundError, SnapshotError):
        return None
    return header.namespace, header.tokens


def kv_digest(namespace: tuple, tokens: tuple[int, ...], cache: list[Any]) -> str:
    """BLAKE2b-256 of a per-layer KV cache as ``save_prompt_cache`` writes it.

    It covers the namespace, the token ids, each layer's cache class and every
    leaf of ``tree_flatten([c.state for c in cache])`` (the tensors and
    scalars that mlx-lm's ``save_prompt_cache`` stores and ``load_prompt_cache``
    gives back through ``from_state``): a tensor's name, dtype, shape and raw
    bytes in row-major order (the bytes safetensors writes), a scalar's name,
    type and value. The arrays are evaluated first, so on a cache just loaded
    from a file this reads the file: the hash covers exactly the bytes the KV
    cache will hold, and a read error raises here.

    Args:
        namespace (tuple): the cache namespace.
        tokens (tuple[int, ...]): the token ids ``cache`` holds.
        cache (list): per-layer mlx-lm caches.

    Returns:
        str: ``"blake2b-256:"`` and 64 hex digits.
    """
    import mlx.core as mx
    from mlx.utils import tree_flatten

    leaves: list[tuple[str, Any]] = tree_flatten([c.state for c in cache])  # type: ignore[assignment]
    mx.eval([value for _, value in leaves if isinstance(value, mx.array)])
    h = hashlib.blake2b(digest_size=32)
    classes = [type(c).__name__ for c in cache]
    h.update(json.dumps([list(namespace), list(tokens), classes]).encode())
    for name, value in leaves:
        if isinstance(value, mx.array):
            h.update(f"\n{name} array {value.dtype} {tuple(value.shape)}\n".encode())
            view = memoryview(value)  # type: ignore[arg-type]  # mx.array is a buffer
            h.update(view if view.c_contiguous else view.tobytes())
        elif isinstance(value, float):  # stored as a float32 array: compare as one
            h.update(f"\n{name} float {struct.pack('<f', value).hex()}\n".encode())
        else:
            h.update(f"\n{name} {type(value).__name__} {value!r}\n".encode())
    return "blake2b-256:" + h.hexdigest()


def load_checked(path: Path, namespace: tuple, tokens: tuple[int, ...]) -> list[Any]:
    """Load a snapshot with mlx-lm's ``load_prompt_cache`` and check its digest
    (engine thread). MLX's ``mx.load`` reads tensors lazily, on their first
    evaluation, so they are read by :func:`kv_digest` itself: what it hashes
    is what the returned cache holds, and nothing is used before the check.

    Args:
        path (Path): the snapshot file.
        namespace (tuple): the namespace the index has for it.
        tokens (tuple[int, ...]): the token ids the index has for it; the
            digest covers both, so a file that holds other tokens fails.

    Returns:
        list: the per-layer caches, read and checked.

    Raises:
        SnapshotError: no digest, or one the tensors do not match.
        Exception: whatever mlx-lm or MLX raises for an unreadable file.
    """
    from mlx_lm.models.cache import load_prompt_cache

    cache, metadata = load_prompt_cache(str(path), return_metadata=True)
    expected = metadata.get(DIGEST_KEY) if isinstance(metadata, dict) else None
    if expected is None:
        raise SnapshotError("no KV digest")
    if kv_digest(namespace, tokens, cache) != expected:
        raise SnapshotError("the tensors do not match their digest")
    return cache

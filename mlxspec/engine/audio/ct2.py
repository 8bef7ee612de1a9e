"""Read a CTranslate2 ``model.bin`` (the format faster-whisper runs) into numpy.

The file is CTranslate2's serialisation of a model spec (``ctranslate2/specs/
model_spec.py`` ``ModelSpec._serialize``, binary version 6), all little-endian:
``u32 version``, ``str spec name``, ``u32 revision``, ``u32 count``, then per
variable ``str name``, ``u8 rank``, ``u32 dims[rank]``, ``u8 dtype``, ``u32
nbytes`` and the raw bytes, then ``u32 count`` aliases as pairs of ``str``. A
``str`` is a ``u16`` length (counting a closing NUL), its UTF-8 bytes and the NUL.
A file split into parts (pip wheels cap a file's size) is read as their
concatenation, in the order given.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["CT2Error", "CT2Model", "read_model_bin"]

#: CTranslate2's ``DataType`` enum order (``include/ctranslate2/types.h``).
_DTYPES: dict[int, np.dtype] = {
    0: np.dtype("<f4"),
    1: np.dtype("i1"),
    2: np.dtype("<i2"),
    3: np.dtype("<i4"),
    4: np.dtype("<f2"),
    5: np.dtype("<u2"),  # bfloat16: raw bits, widened by the caller
}
#: Binary versions this reader understands (6 is what CTranslate2 4.x writes).
_VERSIONS = frozenset({5, 6})


class CT2Error(ValueError):
    """The bytes are not a CTranslate2 model this reader understands."""


@dataclass(frozen=True)
class CT2Model:
    """The variables of a CTranslate2 model.

    Attributes:
        spec (str): the spec's name, e.g. ``"WhisperSpec"``.
        revision (int): the spec revision.
        variables (dict[str, np.ndarray]): name -> array (scalars are 0-d);
            aliases resolve to the same array.
        bfloat16 (frozenset[str]): names whose arrays hold bfloat16 bit patterns.
    """

    spec: str
    revision: int
    variables: dict[str, np.ndarray]
    bfloat16: frozenset[str]

    def scalar(self, name: str) -> int:
        """The integer value of a 0-d variable such as ``encoder/num_heads``."""
        return int(self.variables[name].reshape(()))


class _Reader:
    def __init__(self, data: memoryview | bytes) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> memoryview | bytes:
        if self.at + n > len(self.data):
            raise CT2Error("model.bin is truncated")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def unpack(self, fmt: str) -> tuple:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def string(self) -> str:
        (n,) = self.unpack("<H")
        raw = bytes(self.take(n))
        if not raw.endswith(b"\0"):
            raise CT2Error("model.bin has a malformed name")
        return raw[:-1].decode("utf-8")


def _load_bytes(parts: Sequence[Path]) -> memoryview | bytes:
    if len(parts) == 1:
        with parts[0].open("rb") as f:
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    return b"".join(p.read_bytes() for p in parts)


def read_model_bin(parts: Sequence[Path]) -> CT2Model:
    """Parse a CTranslate2 ``model.bin`` (one file, or its parts in order).

    Args:
        parts (Sequence[Path]): ``[model.bin]`` or ``[model.bin.part1, ...]``.

    Returns:
        CT2Model: every variable as a numpy array (views of the file's bytes
        for a single file; copy what outlives the model).

    Raises:
        CT2Error: unknown binary version or dtype, or truncated/extra bytes.
        OSError: a part cannot be read.
    """
    r = _Reader(_load_bytes(parts))
    (version,) = r.unpack("<I")
    if version not in _VERSIONS:
        raise CT2Error(f"unsupported CTranslate2 binary version {version}")
    spec = r.string()
    (revision,) = r.unpack("<I")
    (count,) = r.unpack("<I")
    variables: dict[str, np.ndarray] = {}
    bf16: set[str] = set()
    for _ in range(count):
        name = r.string()
        (rank,) = r.unpack("<B")
        dims = r.unpack(f"<{rank}I") if rank else ()
        (dtype_id,) = r.unpack("<B")
        (nbytes,) = r.unpack("<I")
        dtype = _DTYPES.get(dtype_id)
        if dtype is None:
            raise CT2Error(f"variable {name} has unknown dtype {dtype_id}")
        array = np.frombuffer(r.take(nbytes), dtype=np.dtype(dtype))
        if array.size != int(np.prod(dims, dtype=np.int64)):
            raise CT2Error(f"variable {name}: {nbytes} bytes do not fill shape {dims}")
        variables[name] = array.reshape(dims)
        if dtype_id == 5:
            bf16.add(name)
    (aliases,) = r.unpack("<I")
    for _ in range(aliases):
        alias, target = r.string(), r.string()
        if target not in variables:
            raise CT2Error(f"alias {alias} names a missing variable {target}")
        variables[alias] = variables[target]
    if r.at != len(r.data):
        raise CT2Error(f"model.bin has {len(r.data) - r.at} unexpected trailing bytes")
    return CT2Model(spec, revision, variables, frozenset(bf16))

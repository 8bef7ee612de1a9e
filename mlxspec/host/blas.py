"""An optimised CBLAS for MLX's CPU backend on Linux.

The ``mlx[cpu]`` Linux wheel links the netlib *reference* BLAS, whose
``cblas_sgemm`` is a plain triple loop: on a 2-core Xeon it multiplies float32
matrices at about 1.5 GFLOP/s, where numpy's OpenBLAS reaches about 115
(``benchmarks/results/cpu-blas.json``). MLX resolves ``cblas_sgemm`` (its only
BLAS entry points are ``cblas_sgemm``, ``cblas_dgemm`` and ``cblas_cgemm``) when
it is first called, searching the process's global symbol scope before the
libraries ``libmlx.so`` itself depends on (glibc's lookup order for objects
opened with ``dlopen``). Loading Intel oneMKL's single dynamic library
``libmkl_rt`` with ``RTLD_GLOBAL`` before ``mlx.core`` is imported therefore
makes every float32 matrix product MLX runs on the CPU use MKL, with no change
to MLX.

MKL comes from the ``mkl`` wheel on PyPI (a dependency of mlxspec on Linux
x86-64). ``MLXSPEC_BLAS`` chooses: unset or ``auto`` (MKL when installed),
``off`` (MLX's own BLAS), or the path of any shared library exporting the
standard LP64 ``cblas_sgemm``.

Quantized weights do not go through BLAS (MLX runs its own CPU kernels for
them), nor do float16/bfloat16 products run at BLAS speed; the engine holds the
weights as float32 on the CPU when this BLAS is active and memory allows
(:func:`mlxspec.engine.model.cpu_weights.apply_cpu_weights`).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BlasStatus", "install", "status"]


@dataclass(frozen=True)
class BlasStatus:
    """Which CBLAS MLX's CPU backend uses in this process.

    Attributes:
        library (str | None): path of the library loaded ahead of MLX's own
            BLAS, or ``None`` when MLX keeps its bundled reference BLAS.
        reason (str): why (``"MKL from the mkl wheel"``, ``"MLXSPEC_BLAS=off"``...).
    """

    library: str | None
    reason: str

    @property
    def fast(self) -> bool:
        """Whether an optimised BLAS is in use."""
        return self.library is not None


_STATUS: BlasStatus | None = None


def status() -> BlasStatus:
    """Return the outcome of :func:`install` (calling it if nobody has)."""
    return _STATUS if _STATUS is not None else install()


def install() -> BlasStatus:
    """Load an optimised CBLAS into the global symbol scope, once per process.

    Must run before ``mlx.core`` is imported (``mlxspec/__init__.py`` calls it);
    later it is too late, as MLX may already have bound its reference BLAS.

    Returns:
        BlasStatus: the library loaded, or why none was.
    """
    global _STATUS
    if _STATUS is None:
        _STATUS = _install()
    return _STATUS


def _install() -> BlasStatus:
    choice = os.environ.get("MLXSPEC_BLAS", "auto").strip()
    if choice.lower() == "off":
        return BlasStatus(None, "MLXSPEC_BLAS=off")
    if not sys.platform.startswith("linux"):
        return BlasStatus(None, "not Linux (MLX uses the platform's BLAS)")
    if "mlx.core" in sys.modules:
        return BlasStatus(None, "mlx.core was imported before mlxspec")
    if choice.lower() in ("", "auto"):
        path = _mkl_rt()
        if path is None:
            return BlasStatus(None, "the mkl wheel is not installed")
        reason = "MKL from the mkl wheel"
        # Sequential MKL: threaded MKL (GNU OpenMP) spins its workers, and on a
        # shared 2-core box one busy process halved decode (6.5 against 11 tok/s)
        # and doubled prefill, while idle it gained at most ~25% (benchmarks/README.md).
        # MKL's default Intel layer would also load a second OpenMP runtime
        # beside torch's libgomp. MKL_THREADING_LAYER set by the user wins.
        os.environ.setdefault("MKL_THREADING_LAYER", "SEQUENTIAL")
    else:
        path = Path(choice)
        reason = "MLXSPEC_BLAS"
    try:
        lib = ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)
        lib.cblas_sgemm  # noqa: B018 (raises AttributeError when missing)
    except (OSError, AttributeError) as exc:
        return BlasStatus(None, f"{path} not usable: {exc}")
    return BlasStatus(str(path), reason)


def _mkl_rt() -> Path | None:
    """Find ``libmkl_rt.so.*`` installed by the ``mkl`` wheel (in ``<prefix>/lib``)."""
    try:
        files = importlib.metadata.files("mkl") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in files:
        if file.name.startswith("libmkl_rt.so"):
            path = Path(file.locate()).resolve()
            if path.is_file():
                return path
    return None

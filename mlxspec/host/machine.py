"""What this machine offers a model: CPU, memory, memory bandwidth, GPU.

Linux facts come from ``/proc/cpuinfo`` and ``/proc/meminfo`` (proc(5));
elsewhere the fields are ``None`` or fall back to ``os``. The bandwidth is a
measured estimate (a timed copy, once per process: NumPy in host memory, or MLX
in the GPU's memory when MLX runs on one), used by ``GET /fit`` to predict
decode speed: decoding one token reads every weight once, so it is
memory-bound (the roofline argument of Williams et al., 2009).
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Bytes per buffer of the bandwidth probe: large enough to leave the caches.
PROBE_BYTES = 64 * 2**20
#: Timed copies; the fastest counts (the others include page faults and noise).
PROBE_REPEATS = 3
#: Bytes per buffer of the GPU probe: a GPU copies 64 MiB in ~30 us on an H200,
#: too close to a kernel launch's cost, so the GPU copies more.
DEVICE_PROBE_BYTES = 512 * 2**20


@dataclass(frozen=True)
class Gpu:
    """The accelerator MLX runs on.

    Args:
        name (str | None): device name, e.g. ``"NVIDIA H200"``.
        memory_bytes (int | None): total device memory.
        free_bytes (int | None): free device memory (CUDA only).
    """

    name: str | None
    memory_bytes: int | None
    free_bytes: int | None


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The CPU's model name (the first ``model name`` line), or ``None`` if unknown."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model") and value.strip():
            return value.strip()
    return None


def memory(meminfo: Path = Path("/proc/meminfo")) -> tuple[int | None, int | None]:
    """Total and available RAM in bytes (``MemTotal``, ``MemAvailable``).

    Falls back to ``os.sysconf`` where ``/proc/meminfo`` is missing; a value
    that cannot be read is ``None``.
    """
    fields: dict[str, int] = {}
    try:
        for line in meminfo.read_text().splitlines():
            key, _, value = line.partition(":")
            parts = value.split()
            if parts and parts[0].isdigit():
                fields[key] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    except OSError:
        pass
    total = fields.get("MemTotal") or _sysconf_pages("SC_PHYS_PAGES")
    available = fields.get("MemAvailable") or _sysconf_pages("SC_AVPHYS_PAGES")
    return total, available


def _sysconf_pages(name: str) -> int | None:
    try:
        return os.sysconf(name) * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


@functools.cache
def bandwidth_gbs() -> float:
    """Host memory bandwidth in GB/s (10**9 bytes), measured once per process.

    Times :data:`PROBE_REPEATS` copies of a :data:`PROBE_BYTES` buffer with
    NumPy; each copy reads and writes the buffer, so moves twice its size. One
    thread, so a lower bound on what a multi-threaded decode can draw.

    Returns:
        float: the fastest copy's rate; about 0.1 s of work on a typical machine.
    """
    import numpy as np

    src = np.ones(PROBE_BYTES // 8, dtype=np.float64)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(PROBE_REPEATS):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * PROBE_BYTES / max(best, 1e-9) / 1e9


@functools.cache
def device_bandwidth_gbs() -> float:
    """Memory bandwidth of MLX's default device in GB/s (10**9 bytes), measured
    once per process.

    Times :data:`PROBE_REPEATS` evaluations of ``src + 1`` over a
    :data:`DEVICE_PROBE_BYTES` float32 buffer after one untimed run (kernel
    compilation); each reads and writes the buffer, so moves twice its size.
    ``mx.eval`` returns when the result is computed, so the time includes one
    kernel launch. Run it where MLX work runs (the engine thread): it allocates
    two buffers of that size on the device for the duration.

    Returns:
        float: the fastest run's rate.
    """
    import mlx.core as mx

    src = mx.ones((DEVICE_PROBE_BYTES // 4,), dtype=mx.float32)
    mx.eval(src)
    best = float("inf")
    for i in range(PROBE_REPEATS + 1):
        start = time.perf_counter()
        dst = src + 1
        mx.eval(dst)
        if i:  # the first run compiles the kernel
            best = min(best, time.perf_counter() - start)
        del dst
    del src
    mx.clear_cache()
    return 2 * DEVICE_PROBE_BYTES / max(best, 1e-9) / 1e9


def gpu() -> Gpu | None:
    """The GPU MLX uses by default, or ``None`` when it runs on the CPU.

    Reads ``mx.device_info()`` (keys vary by backend: ``memory_size`` on Metal,
    ``total_memory``/``free_memory`` on CUDA).
    """
    import mlx.core as mx

    if mx.default_device().type != mx.gpu:
        return None
    info: dict[str, Any] = dict(mx.device_info())
    total = info.get("total_memory") or info.get("memory_size")
    free = info.get("free_memory")
    return Gpu(
        name=str(info["device_name"]) if info.get("device_name") else None,
        memory_bytes=int(total) if total else None,
        free_bytes=int(free) if free else None,
    )


#: Open files the server asks for (each client connection holds one).
OPEN_FILES_WANTED = 65536


def raise_open_files_limit(wanted: int = OPEN_FILES_WANTED) -> int:
    """Raise this process's soft limit on open files toward ``wanted`` (never past
    the hard limit, never lower), as servers that hold many connections do.

    With a soft limit of 1024 or 2048 (common defaults) a few thousand clients,
    or stalled uploads, used up every descriptor and new connections were reset.
    mlx-lm's ``utils`` module sets the limits to ``(2048, 4096)`` when it is
    imported, lowering the hard limit for good (a process cannot raise it again),
    so the first import of ``mlx_lm.utils`` happens here with that one call
    skipped; call this before anything imports mlx-lm. Unix only; elsewhere, or
    when the system refuses, the limit stays.

    Args:
        wanted (int): the soft limit to reach. Default: :data:`OPEN_FILES_WANTED`.

    Returns:
        int: the soft limit in force afterwards (``-1`` where it cannot be read).
    """
    try:
        import resource
    except ImportError:  # not a Unix
        return -1
    _import_mlx_lm_keeping(resource)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):  # the system refused: keep what there is
            pass
    return soft


def _import_mlx_lm_keeping(resource: Any) -> None:
    """Import ``mlx_lm.utils`` with its ``setrlimit(RLIMIT_NOFILE, (2048, 4096))``
    skipped (the open-files limits are this function's caller's to set)."""
    import sys

    if "mlx_lm.utils" in sys.modules:  # imported already: its call has run
        return
    real = resource.setrlimit

    def keep_open_files(which: int, limits: tuple[int, int]) -> None:
        if which != resource.RLIMIT_NOFILE:
            real(which, limits)

    resource.setrlimit = keep_open_files
    try:
        import mlx_lm.utils  # noqa: F401 (imported for its side effect, skipped)
    finally:
        resource.setrlimit = real

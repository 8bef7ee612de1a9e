"""``/library`` on a hub cache of N fake repos (configs, an index, a small weight file).

Issue 30's benchmark: a cold scan (a fresh :class:`mlxspec.library.Registry`:
``scan_cache_dir``, each ``config.json`` and index read, each row assessed) under
1 s for 200 repos, and a cached answer (the 30 s response cache) under 10 ms.
Times the library's own call, the handler's work without HTTP; the machine probe
(bandwidth, ~0.1 s once per process) is measured before and left out.

    python benchmarks/library_scan.py --repos 200 --out benchmarks/results/library-scan.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mlxspec.library import Registry, current_machine  # noqa: E402
from tests.library_cache import add_revision, commit_hash, tiny_config  # noqa: E402


def build(root: Path, repos: int) -> None:
    """``repos`` repos, two in three quantised, one in five with an old revision."""
    for i in range(repos):
        extra = {"quantization": {"bits": 4, "group_size": 64}} if i % 3 else {}
        index = {"metadata": {"total_size": 10_000_000 + i}, "weight_map": {}}
        files = {
            "config.json": tiny_config("llama" if i % 2 else "qwen3", **extra),
            "model.safetensors.index.json": json.dumps(index).encode(),
            "model.safetensors": i.to_bytes(4, "little") * 16,
            "tokenizer_config.json": b"{}",
        }
        add_revision(root, f"org{i % 7}/model-{i}", commit_hash(2 * i + 1), files, ("main",))
        if i % 5 == 0:
            add_revision(root, f"org{i % 7}/model-{i}", commit_hash(2 * i + 2), {"config.json": b"{}"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repos", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hub, own = Path(tmp) / "hub", Path(tmp) / "own"
        build(hub, args.repos)
        os.environ["MLXSPEC_CACHE_DIR"] = str(own)
        machine = current_machine()  # the bandwidth probe, once
        cold, cached = [], []
        for _ in range(args.runs):
            registry = Registry(hub=hub, own=own, machine=lambda: machine)
            t0 = time.perf_counter()
            rows = registry.library()
            cold.append(time.perf_counter() - t0)
            for _ in range(20):
                t0 = time.perf_counter()
                registry.library()
                cached.append(time.perf_counter() - t0)
        assert len(rows) == args.repos, len(rows)
    result = {
        "repos": args.repos,
        "runs": args.runs,
        "cold_scan_s": [round(x, 4) for x in cold],
        "cold_scan_s_median": round(statistics.median(cold), 4),
        "cached_ms_median": round(statistics.median(cached) * 1000, 3),
        "cached_ms_max": round(max(cached) * 1000, 3),
        "targets": {"cold_scan_s": 1.0, "cached_ms": 10.0},
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Probe ``mx.gather_mm`` at the shapes mixed-LoRA layers use (issue 34, item 2).

On mlx-cuda 0.32.4 a mixed-adapter prefill failed with ``cuGraphAddKernelNode ...
invalid argument``; this runs the gathered product at decode (``L = 1``) and prefill
(``L > 1``) shapes, and the per-row take + batched matmul, on the default device,
and prints which raise and whether they agree.

    python benchmarks/gather_probe.py
"""

from __future__ import annotations

import mlx.core as mx


def main() -> None:
    rows, width, rank, experts = 8, 4096, 16, 9
    column = mx.array([1, 2, 3, 4, 5, 6, 7, 8], dtype=mx.int32)  # as the layers index
    print(mx.default_device(), mx.__version__)
    for dtype, length in [(d, n) for d in (mx.float32, mx.bfloat16) for n in (1, 2, 16, 128)]:
        a = mx.random.normal((experts, width, rank)).astype(dtype)
        b = mx.random.normal((experts, rank, width)).astype(dtype)
        x = mx.random.normal((rows, length, width)).astype(dtype)
        want = (x @ a[column]) @ b[column]
        mx.eval(want)
        try:
            got = mx.gather_mm(mx.gather_mm(x, a, rhs_indices=column), b, rhs_indices=column)
            mx.eval(got)
            err = mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item()
            print(f"{dtype} L={length}: gather_mm ok, max |gather - take| = {err:.4g}")
        except Exception as exc:  # noqa: BLE001 - the probe reports what raised
            print(f"{dtype} L={length}: gather_mm raised {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()

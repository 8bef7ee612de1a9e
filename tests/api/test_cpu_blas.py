"""The optimised CPU BLAS (mlxspec/host/blas.py) and float32 CPU weights
(mlxspec/engine/model/cpu_weights.py).

The BLAS swap happens once per process before ``mlx.core`` loads, so each case
that needs a fresh process runs a short script in a subprocess; this test
process itself runs with ``MLXSPEC_BLAS=off`` (see conftest.py).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models.llama import Model, ModelArgs

from mlxspec.engine.model.cpu_weights import apply_cpu_weights, float32_bytes
from mlxspec.host import blas

ROOT = Path(__file__).resolve().parents[2]
LINUX_X86 = sys.platform.startswith("linux") and platform.machine() == "x86_64"

PROBE = textwrap.dedent(
    """
    import json, sys
    import mlxspec
    import mlx.core as mx
    import numpy as np
    from mlxspec.host import blas

    def mkl_libs():
        return sorted({line.split()[-1].rsplit("/", 1)[-1]
                       for line in open("/proc/self/maps") if "libmkl" in line})

    before = mkl_libs()
    a = mx.random.normal((64, 96), key=mx.random.key(1))
    b = mx.random.normal((96, 80), key=mx.random.key(2))
    product = a @ b
    mx.eval(product)
    err = float(np.abs(np.array(product) - np.array(a) @ np.array(b)).max())
    status = blas.status()
    import os
    print(json.dumps({"library": status.library, "reason": status.reason,
                      "layer": os.environ.get("MKL_THREADING_LAYER"),
                      "before": before, "after": mkl_libs(), "err": err}))
    """
)


def probe(blas_env: str | None, prelude: str = "", **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MLXSPEC_BLAS", "MKL_THREADING_LAYER")}
    env.update(extra)
    if blas_env is not None:
        env["MLXSPEC_BLAS"] = blas_env
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", prelude + PROBE],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not LINUX_X86, reason="the mkl wheel exists for Linux x86-64 only")
def test_auto_routes_mlx_float32_matmul_through_mkl() -> None:
    got = probe(None)
    assert got["reason"] == "MKL from the mkl wheel"
    assert got["library"].rsplit("/", 1)[-1].startswith("libmkl_rt.so")
    # mkl_rt loads its core and a CPU-specific kernel library on the first sgemm:
    # proof that MLX's cblas_sgemm call went to MKL, not the bundled reference BLAS.
    assert got["before"] == [got["library"].rsplit("/", 1)[-1]]
    assert got["layer"] == "SEQUENTIAL"  # threaded MKL starves on a shared CPU
    assert {"libmkl_core.so.3", "libmkl_intel_lp64.so.3", "libmkl_sequential.so.3"} <= set(
        got["after"]
    )
    assert got["err"] < 1e-4


@pytest.mark.skipif(not LINUX_X86, reason="the mkl wheel exists for Linux x86-64 only")
def test_users_mkl_threading_layer_wins() -> None:
    got = probe(None, MKL_THREADING_LAYER="GNU")
    assert got["layer"] == "GNU" and "libmkl_gnu_thread.so.3" in got["after"]
    assert got["err"] < 1e-4


def test_off_keeps_mlx_reference_blas() -> None:
    got = probe("off")
    assert (got["library"], got["reason"]) == (None, "MLXSPEC_BLAS=off")
    assert got["after"] == [] and got["err"] < 1e-4


def test_unusable_library_path_is_reported_and_mlx_still_works() -> None:
    got = probe("/nonexistent/libcblas.so")
    assert got["library"] is None
    assert got["reason"].startswith("/nonexistent/libcblas.so not usable: ")
    assert got["after"] == [] and got["err"] < 1e-4


def test_importing_mlx_first_is_too_late_and_said_so() -> None:
    got = probe(None, prelude="import mlx.core\n")
    assert (got["library"], got["reason"]) == (None, "mlx.core was imported before mlxspec")
    assert got["after"] == []


def test_this_test_process_runs_without_the_swap() -> None:
    assert blas.status() == blas.BlasStatus(None, "MLXSPEC_BLAS=off")
    assert not blas.status().fast


# float32 CPU weights ----------------------------------------------------------


def tiny_llama(quantized: bool) -> Model:
    args = ModelArgs(
        model_type="llama",
        hidden_size=64,
        num_hidden_layers=2,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-5,
        vocab_size=96,
        tie_word_embeddings=True,
    )
    mx.random.seed(3)
    model = Model(args)
    model.set_dtype(mx.float16)
    if quantized:
        nn.quantize(model, group_size=32, bits=4)
    mx.eval(model.parameters())
    return model


def dtypes(model: nn.Module) -> set:
    return {v.dtype for _, v in tree_flatten(model.parameters())}


def test_float32_bytes_counts_quantized_layers_as_dense_values() -> None:
    dense = tiny_llama(quantized=False)
    values = sum(v.size for _, v in tree_flatten(dense.parameters()))
    assert float32_bytes(dense) == 4 * values
    # the same shapes quantized: packed weights count as the values they hold
    assert float32_bytes(tiny_llama(quantized=True)) == 4 * values


def test_float32_mode_dequantizes_exactly_and_keeps_the_model_s_answers() -> None:
    model = tiny_llama(quantized=True)
    layer = model.model.layers[0].self_attn.q_proj
    want_q = mx.dequantize(layer.weight, layer.scales, layer.biases, 32, 4).astype(mx.float32)
    tokens = mx.array([[1, 5, 9, 20, 33]])
    before = model(tokens).astype(mx.float32)

    done = apply_cpu_weights(model, "float32")

    assert done.float32 and dtypes(model) == {mx.float32}
    # forced without MKL (this process runs MLXSPEC_BLAS=off): said plainly
    assert done.reason == "--cpu-weights float32, but no optimised BLAS (MLXSPEC_BLAS=off)"
    dense_values = sum(v.size for _, v in tree_flatten(tiny_llama(quantized=False).parameters()))
    assert done.nbytes == float32_bytes(model) == 4 * dense_values
    assert isinstance(model.model.layers[0].self_attn.q_proj, nn.Linear)
    assert mx.array_equal(model.model.layers[0].self_attn.q_proj.weight, want_q)
    after = model(tokens)
    assert after.dtype == mx.float32
    np.testing.assert_allclose(np.array(after), np.array(before), atol=0.02)
    assert mx.array_equal(mx.argmax(after, -1), mx.argmax(before, -1))


def test_auto_without_the_optimised_blas_keeps_the_checkpoint() -> None:
    model = tiny_llama(quantized=True)
    held = sum(v.nbytes for _, v in tree_flatten(model.parameters()))
    done = apply_cpu_weights(model, "auto")
    assert done == type(done)(False, "no optimised BLAS (MLXSPEC_BLAS=off)", held)
    assert mx.uint32 in dtypes(model)


def test_native_and_already_float32_are_left_alone() -> None:
    model = tiny_llama(quantized=True)
    assert apply_cpu_weights(model, "native").reason == "--cpu-weights native"
    assert mx.uint32 in dtypes(model)
    dense = tiny_llama(quantized=False)
    dense.set_dtype(mx.float32)
    assert apply_cpu_weights(dense, "float32").reason == "already float32"


def test_unknown_mode_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="cpu weights mode must be one of auto, float32, native"):
        apply_cpu_weights(tiny_llama(quantized=True), "fp8")


@pytest.mark.skipif(not LINUX_X86, reason="the mkl wheel exists for Linux x86-64 only")
def test_engine_load_converts_a_quantized_checkpoint_with_mkl(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """End to end in a fresh process: ``Engine.load`` with the default ``auto``
    converts a 4-bit checkpoint, and the cache namespace tells the float32 KV
    apart from the checkpoint's."""
    from mlx_lm import convert

    quantized = tmp_path / "tiny-q4"
    convert(str(tiny_model_dir), str(quantized), quantize=True, q_group_size=32, q_bits=4)
    script = textwrap.dedent(
        f"""
        import json
        import mlxspec
        from pathlib import Path
        from mlxspec.engine import Engine
        native = Engine.load(Path({str(quantized)!r}), "tiny", cpu_weights="native")
        auto = Engine.load(Path({str(quantized)!r}), "tiny")
        print(json.dumps({{
            "native": [native.cpu_weights.float32, native.cpu_weights.reason,
                       native.info.weights],
            "auto": [auto.cpu_weights.float32, auto.cpu_weights.reason, auto.info.weights],
        }}))
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "MLXSPEC_BLAS"}
    env["PYTHONPATH"] = str(ROOT)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["native"][:2] == [False, "--cpu-weights native"]
    assert got["auto"][:2] == [True, "float32 for the CPU BLAS (MKL from the mkl wheel)"]
    assert got["auto"][2] == got["native"][2] + "+float32"

"""LoRA adapters on the tiny random model, without a server: adapter folders
(compatibility, the scanned directories), the mixing layers against mlx-lm's
own ``load_adapters``, all-or-nothing mounting and unmounting under a lease."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.random_adapters import make_random_adapter
from mlxspec.engine.adapters.files import (
    bare_name,
    compatible,
    find_adapters,
    read_folder,
    scan_dirs,
)
from mlxspec.engine.adapters.spec import AdapterError


def test_folder_and_compatibility(tmp_path: Path, tiny_model_dir: Path) -> None:
    folder = make_random_adapter(tiny_model_dir, tmp_path / "a", base_model="org/Tiny-Llama")
    about = read_folder(folder)
    assert (about.rank, about.scale, about.fine_tune_type) == (4, 8.0, "lora")
    assert about.size_bytes == (folder / "adapters.safetensors").stat().st_size
    assert bare_name("org/Tiny-Llama") == bare_name("/models/tiny-llama") == "tiny-llama"
    assert compatible(about, "tiny-llama") and not compatible(about, "other")
    anything = make_random_adapter(tiny_model_dir, tmp_path / "b")
    assert compatible(read_folder(anything), "other")  # no recorded base: any model


def test_scan_finds_folders_and_children(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "cache"))
    make_random_adapter(tiny_model_dir, tmp_path / "cache" / "adapters" / "one")
    make_random_adapter(tiny_model_dir, tmp_path / "extra")
    (tmp_path / "cache" / "adapters" / "junk").mkdir()
    dirs = scan_dirs({"MLXSPEC_ADAPTER_DIRS": str(tmp_path / "extra")})
    assert dirs == [tmp_path / "cache" / "adapters", tmp_path / "extra"]
    names = [f.path.name for f in find_adapters(dirs)]
    assert names == ["extra", "one"]  # by name, though cache/ sorts first by path
    # a link in a scanned directory to a folder outside it is not listed: a mount
    # under --adapter-dirs refuses that path (fresh-user pass)
    make_random_adapter(tiny_model_dir, tmp_path / "outside" / "fr")
    (tmp_path / "cache" / "adapters" / "link").symlink_to(tmp_path / "outside" / "fr")
    assert [f.path.name for f in find_adapters(dirs)] == ["extra", "one"]


def _model(path: Path):  # noqa: ANN202
    from mlx_lm import load

    return load(str(path))[0]


def test_mixing_equals_mlx_lm_lora_per_row(tmp_path: Path, tiny_model_dir: Path) -> None:
    """Each row of one mixed call equals the model mlx-lm's ``load_adapters`` builds
    for that row's adapter alone, bit for bit; stacking sums the residuals."""
    import mlx.core as mx
    from mlx_lm.tuner.utils import load_adapters

    from mlxspec.engine.adapters.registry import NO_ADAPTER, AdapterRegistry

    a = make_random_adapter(tiny_model_dir, tmp_path / "a", seed=1, num_layers=2)
    b = make_random_adapter(tiny_model_dir, tmp_path / "b", seed=2, num_layers=1, rank=8)
    tokens = mx.array([[5, 6, 7, 8, 9]])

    def reference(folder: Path | None) -> mx.array:
        model = _model(tiny_model_dir)
        if folder is not None:
            load_adapters(model, str(folder))
        return model(tokens)[0]

    base, only_a, only_b = reference(None), reference(a), reference(b)
    model = _model(tiny_model_dir)
    registry = AdapterRegistry(model, "tiny-llama")
    registry.mount("a", read_folder(a))
    registry.mount("b", read_folder(b))
    pa, pb, pab = registry.pick(["a"]), registry.pick(["b"]), registry.pick(["a", "b"])
    with registry.rows([pa, pb, NO_ADAPTER, pab]):
        out = model(mx.concatenate([tokens] * 4))
    assert mx.array_equal(out[0], only_a) and mx.array_equal(out[1], only_b)
    assert mx.array_equal(out[2], base)
    with registry.rows([pab]):
        stacked = model(tokens)[0]
    assert mx.array_equal(out[3], stacked)
    assert not mx.allclose(stacked, only_a) and not mx.allclose(stacked, only_b)
    assert mx.array_equal(model(tokens)[0], base)  # outside a selection: the base model
    # one token a row (decode: the gathered products) as well as five (prefill: per-row takes)
    one = tokens[:, :1]
    with registry.rows([pa, pb]):
        out1 = model(mx.concatenate([one] * 2))
    with registry.rows([pa]):
        solo_a = model(one)[0]
    with registry.rows([pb]):
        solo_b = model(one)[0]
    assert mx.array_equal(out1[0], solo_a) and mx.array_equal(out1[1], solo_b)
    assert mx.allclose(solo_a, only_a[:1], atol=1e-5)
    # both digests, in the order named: the prompt cache's namespace of a stack
    assert pab.tag == f"{pa.tag}+{pb.tag}" != registry.pick(["b", "a"]).tag


def test_mismatch_mounts_nothing(tmp_path: Path, tiny_model_dir: Path) -> None:
    """An adapter of another model's shapes is refused whole: no layer changes."""
    import mlx.core as mx
    from mlx_lm.models.llama import Model, ModelArgs

    from mlxspec.engine.adapters.registry import AdapterRegistry

    config = json.loads((tiny_model_dir / "config.json").read_text())
    config["hidden_size"], config["intermediate_size"] = 96, 192
    wrong = make_random_adapter(Model(ModelArgs.from_dict(config)), tmp_path / "wrong")
    model = _model(tiny_model_dir)
    registry = AdapterRegistry(model, "tiny-llama")
    registry.mount("a", read_folder(make_random_adapter(tiny_model_dir, tmp_path / "a")))
    tokens = mx.array([[5, 6, 7]])
    with registry.rows([registry.pick(["a"])]):
        before = model(tokens)
    with pytest.raises(AdapterError, match="does not match model parameter shape"):
        registry.mount("wrong", read_folder(wrong))
    assert registry.ids() == ["a"]
    with registry.rows([registry.pick(["a"])]):
        assert mx.array_equal(model(tokens), before)
    assert type(model.model.layers[0].self_attn.q_proj).__name__ == "AdapterLinear"


def test_unmount_waits_for_the_last_lease(tmp_path: Path, tiny_model_dir: Path) -> None:
    """An adapter unmounted while a request holds it leaves the listing at once
    and keeps its layers until the lease ends."""
    from mlxspec.engine.adapters.registry import AdapterRegistry

    model = _model(tiny_model_dir)
    registry = AdapterRegistry(model, "tiny-llama")
    registry.mount("a", read_folder(make_random_adapter(tiny_model_dir, tmp_path / "a")))
    owner = object()
    pick = registry.acquire(owner, ["a"])
    assert registry.unmount("a") == 14
    assert registry.ids() == [] and registry.active
    with pytest.raises(AdapterError, match="no longer mounted"):
        registry.pick(["a"])
    registry.release(owner)
    assert not registry.active and pick.slots == (1,)

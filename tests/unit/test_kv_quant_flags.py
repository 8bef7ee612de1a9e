"""``--kv-quant``, ``--kv-bits``, ``--kv-group-size``, ``--quantized-kv-start``
and ``--kv-config``: what reaches the configuration, every value or combination
that cannot work refused at start-up in one line naming the flag (exit 2), and
``kv_config.json``'s two shapes read into per-layer bits."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from mlxspec.cli.flags import parse_config
from mlxspec.config import ServeConfig
from mlxspec.engine.caches.kv_scheme import KvOptions, KvQuantError, resolve_scheme


def _kv(config: ServeConfig) -> tuple:
    return (config.kv_quant, config.kv_group_size, config.quantized_kv_start, config.kv_config)


def test_the_flags_reach_the_config() -> None:
    assert _kv(parse_config(["serve", "m"])) == ("bf16", 64, 0, None)
    assert _kv(parse_config(["serve", "m", "--kv-bits", "4"])) == ("kv4", 64, 0, None)
    line = ["--kv-bits", "8", "--kv-group-size", "32", "--quantized-kv-start", "100"]
    assert _kv(parse_config(["serve", "m", *line])) == ("kv8", 32, 100, None)
    assert _kv(parse_config(["serve", "m", "--kv-quant", "kv4", "--kv-bits", "4"]))[0] == "kv4"
    config = parse_config(["serve", "m", "--kv-quant", "config", "--kv-config", "k.json"])
    assert _kv(config) == ("config", 64, 0, "k.json")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--kv-bits", "3"], "--kv-bits: 3 is not served; use 4 or 8"),
        (["--kv-quant", "kv4", "--kv-bits", "8"], "--kv-bits: 8 contradicts --kv-quant kv4"),
        (["--kv-quant", "bf16", "--kv-bits", "4"], "--kv-bits: 4 contradicts --kv-quant bf16"),
        (
            ["--kv-quant", "config", "--kv-bits", "4"],
            "--kv-bits: --kv-quant config takes each layer's bits from kv_config.json",
        ),
        (
            ["--kv-bits", "4", "--kv-group-size", "48"],
            "--kv-group-size: 48 is not one of 32, 64, 128",
        ),
        (
            ["--kv-group-size", "64"],
            "--kv-group-size: needs --kv-bits or --kv-quant kv8|kv4|config",
        ),
        (
            ["--quantized-kv-start", "10"],
            "--quantized-kv-start: needs --kv-bits or --kv-quant kv8|kv4|config",
        ),
        (["--kv-bits", "4", "--kv-config", "k.json"], "--kv-config: needs --kv-quant config"),
    ],
)
def test_bad_values_and_combinations_are_one_line_errors(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(["serve", "m", *argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"mlxspec: error: {line}\n"


class _Model:
    """Enough of an mlx-lm model for ``make_prompt_cache``: four KV layers."""

    layers = [object()] * 4
    args = SimpleNamespace(head_dim=64)


def _scheme(tmp_path: Path, doc: object, **kw) -> tuple:
    (tmp_path / "kv_config.json").write_text(json.dumps(doc))
    scheme = resolve_scheme(KvOptions("config", **kw), _Model(), tmp_path)
    return scheme.layer_bits, scheme.group_size, scheme.tag


def test_kv_config_json_shapes(tmp_path: Path) -> None:
    assert _scheme(tmp_path, {"layers": ["kv8", "kv4", "kv4", "bf16"]}) == (
        (8, 4, 4, None),
        64,
        "8,4,4,-/g64/s0",
    )
    doc = {"group_size": 32, "default": "kv4", "layers": {"0": "kv8", "3": "kv8"}}
    assert _scheme(tmp_path, doc) == ((8, 4, 4, 8), 32, "8,4,4,8/g32/s0")
    assert _scheme(tmp_path, {"layers": {}, "default": "kv8"}, start=5)[2] == "kv8/g64/s5"


@pytest.mark.parametrize(
    ("doc", "why"),
    [
        ("{", "is not JSON"),
        ([1], 'expected an object with "layers"'),
        ({"layers": ["kv4"]}, "layers lists 1 schemes; the model has 4 KV cache layers"),
        ({"layers": {"9": "kv4"}}, "layer '9' is not one of 0..3"),
        ({"layers": {"0": "kv3"}}, "layers[0] must be one of bf16, kv8, kv4, not 'kv3'"),
        ({"layers": {}, "group_size": 48}, "group_size must be one of 32, 64, 128"),
        ({"layers": {}}, "this model has no full-attention KV cache layer to quantise"),
    ],
)
def test_a_malformed_kv_config_names_the_flag(tmp_path: Path, doc: object, why: str) -> None:
    (tmp_path / "kv_config.json").write_text(doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(KvQuantError) as exc:
        resolve_scheme(KvOptions("config"), _Model(), tmp_path)
    assert str(exc.value).startswith("--kv-quant config: ")
    assert why in str(exc.value)


def test_a_group_size_that_does_not_divide_the_head_is_refused() -> None:
    model = _Model()
    model.args = SimpleNamespace(head_dim=16)  # the tiny test model's heads
    with pytest.raises(KvQuantError, match="^--kv-group-size: 64 does not divide"):
        resolve_scheme(KvOptions("kv4"), model, None)
    with pytest.raises(KvQuantError, match="^--kv-config: no kv_config.json at /nope"):
        resolve_scheme(KvOptions("config", config_path="/nope"), _Model(), None)


def test_a_malformed_kv_config_stops_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fixtures.tiny_model import build_tiny_llama
    from mlxspec.cli.main import EXIT_MODEL_ERROR, serve
    from mlxspec.conformance.live import free_port

    model = build_tiny_llama(tmp_path / "m", head_dim=64)
    (model / "kv_config.json").write_text('{"layers": ["kv4"]}')
    config = ServeConfig(model=str(model), kv_quant="config", port=free_port())
    assert serve(config) == EXIT_MODEL_ERROR == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("mlxspec: error:")]
    assert lines == [
        f"mlxspec: error: --kv-quant config: {model / 'kv_config.json'}: layers lists 1 "
        "schemes; the model has 2 KV cache layers"
    ]

"""``--fill`` and ``MLXSPEC_FILL``: what reaches the configuration, and every
value or combination that cannot work refused at start-up in one line naming
the flag (exit 2)."""

from __future__ import annotations

import pytest

from mlxspec.cli.flags import parse_config
from mlxspec.cli.group_serve import group_problem
from mlxspec.config import ServeConfig


def test_the_flag_and_the_variable_reach_the_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLXSPEC_FILL", raising=False)
    assert parse_config(["serve", "m"]).fill == "off"
    assert parse_config(["serve", "m", "--fill", "strict"]).fill == "strict"
    monkeypatch.setenv("MLXSPEC_FILL", "Strict")
    assert parse_config(["serve", "m"]).fill == "strict"
    assert parse_config(["serve", "m", "--fill", "off"]).fill == "off"  # the flag wins


@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        (["--fill", "echo"], "", "--fill: echo is not supported yet (strict is)"),
        ([], "echo", "--fill: echo is not supported yet (strict is)"),
        ([], "yes", "MLXSPEC_FILL: yes is not one of off, strict"),
    ],
)
def test_unsupported_modes_are_one_line_errors(
    argv: list[str],
    env: str,
    line: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MLXSPEC_FILL", env)
    with pytest.raises(SystemExit) as exc:
        parse_config(["serve", "m", *argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"mlxspec: error: {line}\n"


def test_a_model_whose_cache_cannot_rewind_is_refused() -> None:
    from mlx_lm.models.cache import RotatingKVCache

    from mlxspec.engine.speculative import SpeculationError, mount

    class Windowed:  # an mlx-lm model whose layers keep a sliding window
        layers = [object(), object()]

        def make_cache(self) -> list:
            return [RotatingKVCache(max_size=16), RotatingKVCache(max_size=16)]

    with pytest.raises(SpeculationError, match="^--fill: token fast-forwarding needs plain"):
        mount(None, Windowed(), None, fill=True)
    assert mount(None, Windowed(), None, fill=False) is None  # nothing asked, nothing checked


def test_a_sharded_model_refuses_fill() -> None:
    problem = group_problem(ServeConfig(model="m", fill="strict"), "ring")
    assert problem == "--fill is not supported with a model sharded over processes (mlx.launch)"
    assert group_problem(ServeConfig(model="m"), "ring") is None


def test_the_span_length_follows_the_cost_of_a_verify_step() -> None:
    """A lone row feeds its whole span on the CPU; one span among eight rows is
    not worth padding every row for (a plain step), spans in all eight rows are;
    a step that verifies drafts anyway feeds spans at least that long; on a GPU
    (a large fixed cost) one span among eight is fed."""
    from mlxspec.engine.speculative.fill import FIXED_COST, span_length

    cpu, gpu = FIXED_COST["cpu"], FIXED_COST["gpu"]
    assert span_length(1, [16], 0, cpu, 0.9) == 16
    assert span_length(8, [16], 0, cpu, 0.9) == 0
    assert span_length(8, [16] * 8, 0, cpu, 0.9) == 16
    assert span_length(8, [16], 3, cpu, 0.9) == 3
    assert span_length(8, [16], 0, gpu, 0.9) > 0
    assert span_length(1, [16], 0, cpu, 0.0) == 0  # a model that never agrees: no fill

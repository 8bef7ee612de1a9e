"""``--draft-model``, ``--draft-kind`` and ``--num-draft-tokens``: what reaches
the configuration, and every combination that cannot work refused at start-up
in one line naming the flag (exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlxspec.cli.flags import parse_config
from mlxspec.config import ServeConfig


def test_the_flags_reach_the_config() -> None:
    config = parse_config(["serve", "m", "--draft-model", "d", "--num-draft-tokens", "5"])
    assert (config.draft_kind, config.draft_model, config.num_draft_tokens) == ("model", "d", 5)
    config = parse_config(["serve", "m", "--draft-kind", "ngram"])
    assert (config.draft_kind, config.draft_model, config.num_draft_tokens) == ("ngram", None, 3)
    config = parse_config(["serve", "m"])
    assert (config.draft_kind, config.draft_model) == (None, None)


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--draft-kind", "ngram", "--draft-model", "d"],
            "--draft-kind: ngram mounts no draft model; drop --draft-model",
        ),
        (["--draft-kind", "model"], "--draft-kind: model needs --draft-model PATH"),
        (
            ["--num-draft-tokens", "4"],
            "--num-draft-tokens: needs --draft-model or --draft-kind ngram",
        ),
    ],
)
def test_bad_flag_combinations_are_one_line_errors(
    argv: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(["serve", "m", *argv])
    assert exc.value.code == 2
    assert capsys.readouterr().err == f"mlxspec: error: {line}\n"


def test_zero_draft_tokens_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(["serve", "m", "--draft-kind", "ngram", "--num-draft-tokens", "0"])
    assert exc.value.code == 2
    assert "--num-draft-tokens" in capsys.readouterr().err


def _serve_error(config: ServeConfig, capsys: pytest.CaptureFixture[str]) -> str:
    from mlxspec.cli.main import EXIT_MODEL_ERROR, serve

    assert serve(config) == EXIT_MODEL_ERROR
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("mlxspec: error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_draft_with_another_tokenizer_stops_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fixtures.tiny_model import build_tiny_llama
    from mlxspec.conformance.live import free_port

    target = build_tiny_llama(tmp_path / "target")
    draft = build_tiny_llama(tmp_path / "draft", extra_tokens=("<x1>", "<x2>"))
    config = ServeConfig(
        model=str(target), draft_kind="model", draft_model=str(draft), port=free_port()
    )
    line = _serve_error(config, capsys)
    assert line.startswith(f"mlxspec: error: --draft-model: {draft} has another tokenizer")


def test_an_unreadable_draft_stops_the_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fixtures.tiny_model import build_tiny_llama
    from mlxspec.conformance.live import free_port

    target = build_tiny_llama(tmp_path / "target")
    config = ServeConfig(
        model=str(target), draft_kind="model", draft_model=str(tmp_path / "nope"), port=free_port()
    )
    line = _serve_error(config, capsys)
    assert line.startswith(f"mlxspec: error: --draft-model: cannot load {tmp_path / 'nope'}")


def test_a_model_whose_cache_cannot_rewind_is_refused() -> None:
    from mlx_lm.models.cache import RotatingKVCache

    from mlxspec.engine.speculative import SpeculationError, SpeculationOptions, mount

    class Windowed:  # an mlx-lm model whose layers keep a sliding window
        layers = [object(), object()]

        def make_cache(self) -> list:
            return [RotatingKVCache(max_size=16), RotatingKVCache(max_size=16)]

    with pytest.raises(SpeculationError, match="^--draft-kind: speculative decoding needs plain"):
        mount(SpeculationOptions("ngram", 3), Windowed(), None)

"""A slow first start shows progress: a bar on a terminal, one line elsewhere
(:mod:`mlxspec.engine.model.progress`)."""

from __future__ import annotations

import io

import pytest

from mlxspec.engine.model import progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_off_a_terminal_one_line_per_step(capsys: pytest.CaptureFixture[str]) -> None:
    with progress.progress("converting m.gguf once", 4, unit="step") as advance:
        for _ in range(4):
            advance(1)
    assert capsys.readouterr().err == "mlxspec: converting m.gguf once\n"


def test_on_a_terminal_a_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    screen = Terminal()
    monkeypatch.setattr("sys.stderr", screen)
    with progress.progress("hashing m.gguf", 3 << 20) as advance:
        for _ in range(3):
            advance(1 << 20)
    drawn = screen.getvalue()
    assert "mlxspec: hashing m.gguf" in drawn and "100%" in drawn and "3.00M" in drawn


def test_a_closed_or_odd_stream_is_no_terminal() -> None:
    closed = io.StringIO()
    closed.close()
    assert progress.on_terminal(closed) is False
    assert progress.on_terminal(object()) is False  # type: ignore[arg-type]
    assert progress.on_terminal(Terminal()) is True

"""Training data folders: which format a JSONL file holds, and its broken lines.

A data folder holds ``train.jsonl`` and optionally ``valid.jsonl`` (mlx-lm's
layout, reference "Fine-tune"). Each row's keys name its format, as mlx-lm's
``tuner/datasets.py`` reads them: ``messages`` (chat), ``prompt`` +
``completion``, ``text``, or ``prompt`` + ``chosen`` + ``rejected`` (``dpo``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FORMATS", "DataReport", "inspect_folder", "row_format"]

#: The formats a row may have (reference, ``inspect-dataset``), and ``unknown``.
FORMATS = ("messages", "prompt-completion", "text", "dpo", "unknown")
#: Most broken lines a report names.
MAX_BAD_LINES = 20


def row_format(row: Any) -> str:
    """The format of one JSON row (one of :data:`FORMATS`)."""
    if not isinstance(row, dict):
        return "unknown"
    if "chosen" in row and "rejected" in row:
        return "dpo"
    if isinstance(row.get("messages"), list):
        return "messages"
    if "prompt" in row and "completion" in row:
        return "prompt-completion"
    if isinstance(row.get("text"), str):
        return "text"
    return "unknown"


@dataclass
class DataReport:
    """What :func:`inspect_folder` found.

    Args:
        n_train (int): rows of ``train.jsonl``.
        n_valid (int): rows of ``valid.jsonl`` (0 without one).
        format (str): the rows' format (the first row's; ``unknown`` if mixed).
        bad_lines (list[str]): ``"<file> line N: why"``, first :data:`MAX_BAD_LINES`.
        error (str | None): why the folder cannot be trained on.
    """

    n_train: int = 0
    n_valid: int = 0
    format: str = "unknown"
    bad_lines: list[str] = field(default_factory=list)
    error: str | None = None

    def wire(self) -> dict[str, Any]:
        """The ``inspect-dataset`` answer (``ok`` false when there is an error)."""
        body: dict[str, Any] = {"ok": self.error is None, "n_train": self.n_train}
        body.update(n_valid=self.n_valid, format=self.format)
        if self.bad_lines:
            body["bad_lines"] = self.bad_lines
        if self.error is not None:
            body["error"] = self.error
        return body


def _scan(path: Path, report: DataReport) -> tuple[int, set[str]]:
    """Count ``path``'s rows; broken ones go into ``report.bad_lines``."""
    count, formats = 0, set()
    with path.open("rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw)
            except ValueError as e:
                report.bad_lines.append(f"{path.name} line {number}: not valid JSON ({e})")
                continue
            kind = row_format(row)
            if kind == "unknown":
                report.bad_lines.append(f"{path.name} line {number}: no known format's keys")
                continue
            formats.add(kind)
            count += 1
    return count, formats


def inspect_folder(folder: Path) -> DataReport:
    """Read a data folder's ``train.jsonl`` (and ``valid.jsonl``).

    Args:
        folder (Path): the data folder.

    Returns:
        DataReport: row counts, the format, broken lines (with numbers) and an
        error: ``<path>/train.jsonl not found``, an empty training set, broken
        lines, or rows of several formats.
    """
    report = DataReport()
    train = folder / "train.jsonl"
    if not train.is_file():
        report.error = f"{train} not found"
        return report
    report.n_train, formats = _scan(train, report)
    valid = folder / "valid.jsonl"
    if valid.is_file():
        report.n_valid, more = _scan(valid, report)
        formats |= more
    if len(formats) == 1:
        report.format = formats.pop()
    if report.bad_lines:
        n = len(report.bad_lines)
        report.error = f"{n} broken line{'s' * (n != 1)}: {report.bad_lines[0]}"
        del report.bad_lines[MAX_BAD_LINES:]
    elif len(formats) > 1:
        report.error = f"rows of several formats: {', '.join(sorted(formats))}"
    elif report.n_train == 0:
        report.error = f"{train} holds no rows"
    return report

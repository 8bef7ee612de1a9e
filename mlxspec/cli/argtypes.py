"""argparse ``type=`` validators shared by the flag groups (an error names the bound)."""

from __future__ import annotations

import argparse
from pathlib import Path


def positive_int(text: str) -> int:
    """An integer >= 1.

    Raises:
        argparse.ArgumentTypeError: below 1. ``ValueError`` (not an integer) is
            argparse's own "invalid int value" message.
    """
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0.

    Raises:
        argparse.ArgumentTypeError: below 0.
    """
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return value


def niceness(text: str) -> int:
    """A process niceness from 0 (the server's own priority) to 19 (the lowest);
    raising a priority (below 0) needs privileges a server should not hold
    (``setpriority(2)``).

    Raises:
        argparse.ArgumentTypeError: not an integer from 0 to 19.
    """
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise argparse.ArgumentTypeError(f"must be a whole number from 0 to 19, not {text!r}")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds >= 0 (``inf`` would reach ``/stats`` as JSON's
    invalid ``Infinity``; ``0`` is each flag's "never").

    Raises:
        argparse.ArgumentTypeError: not a number, negative, NaN or infinite.
    """
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number of seconds >= 0, not {text!r}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0.

    Raises:
        argparse.ArgumentTypeError: zero, negative, NaN or infinite.
    """
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be a positive number")
    return value


def existing_folder(text: str) -> str:
    """An existing folder, as its resolved absolute path (``--web-tools``).

    Raises:
        argparse.ArgumentTypeError: no such folder.
    """
    path = Path(text).expanduser().resolve()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is not a folder")
    return str(path)

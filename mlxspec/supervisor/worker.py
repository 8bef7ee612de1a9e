"""A pool child's entry point: ``python -m mlxspec.supervisor.worker CONFIG``.

``CONFIG`` is a JSON file the parent wrote (:func:`write_config`): its
:class:`~mlxspec.config.ServeConfig` with ``model`` and ``unix`` set and the
supervisor's own fields cleared, so the child is exactly ``mlxspec serve MODEL
--unix PATH`` with the parent's other flags.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from mlxspec.config import ServeConfig


def child_config(config: ServeConfig, model: str | None, socket_path: str) -> ServeConfig:
    """The settings of the child serving ``model`` on ``socket_path``.

    Args:
        config (ServeConfig): the parent's settings.
        model (str | None): the child's model spec (``None``: the embedded default).
        socket_path (str): the child's unix socket.

    Returns:
        ServeConfig: ``config`` as a worker: one model, the socket, no pool.
    """
    return dataclasses.replace(
        config,
        model=model,
        unix=socket_path,
        isolate=False,
        model_pool=(),
        pool_pin=(),
        pool_max_resident=None,
        pool_idle_unload=None,
    )


def write_config(config: ServeConfig, path: Path) -> None:
    """Write ``config`` as JSON to ``path`` (mode 0600: it may hold the API key)."""
    data = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    data["chat_template_args"] = dict(config.chat_template_args)
    path.touch(mode=0o600)
    path.write_text(json.dumps(data))


def read_config(path: Path) -> ServeConfig:
    """The :class:`ServeConfig` :func:`write_config` wrote (lists back to tuples)."""
    data: dict[str, Any] = json.loads(path.read_text())
    for f in dataclasses.fields(ServeConfig):
        if isinstance(f.default, tuple) and isinstance(data.get(f.name), list):
            data[f.name] = tuple(data[f.name])
    return ServeConfig(**data)


def main(argv: list[str]) -> int:
    """Serve the configured model on its unix socket (``mlxspec serve --unix``)."""
    from mlxspec.cli.main import serve
    from mlxspec.config import apply_serve_env_defaults

    config = read_config(Path(argv[0]))
    apply_serve_env_defaults()
    _exit_with_parent()
    return serve(config)


def _exit_with_parent(interval: float = 1.0) -> None:
    """End this child when its parent is gone (killed with SIGKILL, it cannot
    stop its children): a daemon thread notices the new parent id."""
    import os
    import threading
    import time

    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(interval)
        os._exit(1)

    threading.Thread(target=watch, name="mlxspec-parent-watch", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

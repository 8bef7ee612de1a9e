"""Run the ``--isolate`` parent: bind the TCP port, start the children, proxy.

The children's sockets and settings live in a private directory
(``tempfile.mkdtemp``: mode 0700), removed at exit, beside the socket of the
parent's Responses store (:class:`~mlxspec.handlers.responses.shared_store.StoreServer`):
the children keep their finished responses there, so a restart keeps them.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import sys
import tempfile
from pathlib import Path

from mlxspec.config import ServeConfig

#: Seconds in-flight requests may run after SIGINT/SIGTERM (as a direct server).
DRAIN_TIMEOUT_S = 120


def serve_isolated(config: ServeConfig) -> int:
    """Serve ``config`` with the engine(s) in child processes. Returns an exit code."""
    from mlxspec.cli.main import EXIT_MODEL_ERROR, _bind_problem, _draining_server
    from mlxspec.handlers.responses.shared_store import StoreServer
    from mlxspec.http.access_log import ErrorNotes
    from mlxspec.http.connections import uvicorn_config
    from mlxspec.http.guard import RequestGuard
    from mlxspec.supervisor.parent import ParentApp
    from mlxspec.supervisor.pool import Pool

    logging.basicConfig(
        level=config.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    if (problem := _bind_problem(config.host, config.port)) is not None:
        print(
            f"mlxspec: error: cannot listen on {config.host}:{config.port}: {problem}",
            file=sys.stderr,
        )
        return EXIT_MODEL_ERROR
    directory = Path(tempfile.mkdtemp(prefix="mlxspec-engine-"))
    store = StoreServer(str(directory / "responses.sock"))
    try:
        # the children keep their finished responses in this process's store
        shared = dataclasses.replace(
            config, response_store=store.address, response_store_key=store.key
        )
        pool = Pool(shared, directory)
        app = ErrorNotes(RequestGuard(ParentApp(config, pool, store.store), config))
        url = f"http://{config.host}:{config.port}"
        models = ", ".join(pool.ids)
        banner = [f"mlxspec: isolated engine ({models}) at {url}/v1, children in {directory}"]
        server = _draining_server(
            uvicorn_config(app, config, timeout_graceful_shutdown=DRAIN_TIMEOUT_S, lifespan="on"),
            banner=banner,
        )
        server.run()
        return 0 if server.started else 3
    finally:
        store.close()
        shutil.rmtree(directory, ignore_errors=True)

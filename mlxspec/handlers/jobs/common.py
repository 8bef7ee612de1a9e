"""What the jobs handlers share: the manager of the request's app, path
confinement as a 400, and the runner's view of this server (its own ``/v1``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from connexion.context import scope

from mlxspec.errors import ApiError
from mlxspec.jobs import JobManager, OutsideRoots

__all__ = ["confine", "current_jobs", "runner_env"]


def current_jobs() -> JobManager:
    """The app's job manager.

    Raises:
        ApiError: 404 when the server runs without ``--jobs`` (the routes are
            not in its document then, so this is a guard only).
    """
    manager = scope["state"].get("jobs")
    if manager is None:
        raise ApiError("not_found", "jobs are off: start the server with --jobs")
    return manager


def confine(path: str, field: str) -> Path:
    """``path`` resolved inside the jobs' roots.

    Raises:
        ApiError: 400 ``invalid_request`` naming ``field`` and the roots.
    """
    try:
        return current_jobs().roots.confine(path, field)
    except OutsideRoots as e:
        raise ApiError("invalid_request", str(e), param=field) from e


def runner_env() -> dict[str, str]:
    """The environment a runner needs to call this server's own ``/v1``:
    ``MLXSPEC_JOB_API`` (loopback, the port the request came in on) and
    ``MLXSPEC_JOB_API_KEY`` under ``--api-key``."""
    server = scope.get("server") or ("127.0.0.1", 8080)
    host = "[::1]" if ":" in str(server[0]) else "127.0.0.1"
    env = {"MLXSPEC_JOB_API": f"http://{host}:{server[1]}"}
    config: Any = scope["state"].get("config")
    if getattr(config, "api_key", None):
        env["MLXSPEC_JOB_API_KEY"] = config.api_key
    return env

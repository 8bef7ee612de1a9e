"""``mlxspec serve --jobs ROOT``: the fine-tune, quantize and dataset jobs
(:mod:`mlxspec.jobs`). Off by default: jobs run commands and read paths a client
names, so they are served only on a loopback bind, and the paths they take must
lie in a ``--jobs`` folder, mlxspec's cache or the HF hub cache."""

from __future__ import annotations

import argparse
from typing import Any

from mlxspec.http.guard import binds_loopback


def add_jobs_flags(serve: argparse.ArgumentParser) -> None:
    """Add ``--jobs`` to the ``serve`` parser."""
    serve.add_argument(
        "--jobs",
        action="append",
        default=[],
        metavar="DIR",
        help="serve the jobs routes (/api/jobs, /api/finetune/*, /api/quantize/*, "
        "/api/dataset/*); job paths may lie in DIR (repeatable), mlxspec's cache and "
        "the HF hub cache. Loopback binds only; off by default",
    )


def jobs_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The :class:`~mlxspec.config.ServeConfig` fields ``--jobs`` sets.

    Raises:
        SystemExit: (``parser.error``) ``--jobs`` with a non-loopback ``--host``, or
            with ``--isolate`` / ``--unix`` (the lease is the engine's, in one process).
    """
    if not args.jobs:
        return {"jobs_roots": ()}
    if not binds_loopback(args.host):
        parser.error("--jobs runs commands for clients: it needs a loopback --host")
    if args.isolate or args.unix:
        parser.error("--jobs cannot be combined with --isolate or --unix")
    return {"jobs_roots": tuple(args.jobs)}

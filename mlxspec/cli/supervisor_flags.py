"""``mlxspec serve``'s process flags: worker mode (``--unix``), the isolated
parent (``--isolate``), its model pool (``--model-pool``, ``--pool-*``) and
``--strict-model`` (reference, route index "Internal routes")."""

from __future__ import annotations

import argparse
from typing import Any

from mlxspec.cli.argtypes import positive_int, seconds


def add_supervisor_flags(serve: argparse.ArgumentParser) -> None:
    """Add the worker, isolation and pool flags to the ``serve`` parser."""
    serve.add_argument(
        "--unix",
        metavar="PATH",
        default=None,
        help="serve on this unix socket (mode 0600) instead of TCP, with the worker routes "
        "POST /admin/drain and POST /admin/lease (never on TCP)",
    )
    serve.add_argument(
        "--isolate",
        action="store_true",
        help="run the engine in a child process behind this one, which proxies every route, "
        "restarts a child that dies and answers 502 engine_unavailable meanwhile",
    )
    serve.add_argument(
        "--model-pool",
        nargs="+",
        default=[],
        metavar="MODEL",
        help="with --isolate: more models to serve, one child each, picked by the body's "
        "'model' (started on first use)",
    )
    serve.add_argument(
        "--pool-max-resident",
        type=positive_int,
        default=None,
        metavar="N",
        help="most pool children running at once; the least recently used idle one stops "
        "first (default: no cap)",
    )
    serve.add_argument(
        "--pool-idle-unload",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="stop a pool child idle this long (default: never); a body's keep_alive "
        "overrides it for that model, 0 = stop after the request",
    )
    serve.add_argument(
        "--pool-pin",
        action="append",
        default=[],
        metavar="MODEL",
        help="a pool model id never evicted nor unloaded (repeatable)",
    )
    serve.add_argument(
        "--pool-start-timeout",
        type=seconds,
        default=600.0,
        metavar="SECONDS",
        help="seconds a child may take to become healthy before it is killed (default 600)",
    )
    serve.add_argument(
        "--strict-model",
        action="store_true",
        help="answer a 'model' naming nothing served (model, alias, adapter, pool) with "
        "404 model_not_found; default: ignored, the served model answers",
    )


def supervisor_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The :class:`~mlxspec.config.ServeConfig` fields these flags set.

    Raises:
        SystemExit: (``parser.error``) ``--model-pool`` or ``--pool-*`` without
            ``--isolate``, or ``--unix`` with ``--isolate``.
    """
    pool_flags = (
        args.model_pool
        or args.pool_pin
        or args.pool_max_resident is not None
        or args.pool_idle_unload is not None
    )
    if pool_flags and not args.isolate:
        parser.error("--model-pool and --pool-* need --isolate")
    if args.unix and args.isolate:
        parser.error("--unix serves a worker: it cannot be combined with --isolate")
    return {
        "unix": args.unix,
        "isolate": args.isolate,
        "model_pool": tuple(args.model_pool),
        "pool_max_resident": args.pool_max_resident,
        "pool_idle_unload": args.pool_idle_unload,
        "pool_pin": tuple(args.pool_pin),
        "pool_start_timeout": args.pool_start_timeout,
        "strict_model": args.strict_model,
    }

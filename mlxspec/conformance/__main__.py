"""``python -m mlxspec.conformance``: the conformance harness's command line.

Subcommands:

* ``fuzz [--examples N] [--url URL] ...``: schemathesis against a live server
  (:mod:`.fuzz`); without ``--url`` it starts ``mlxspec serve`` on the embedded
  default model itself.
* ``parity ...``: the mlx_lm.server parity harness (:mod:`.parity`, imported
  only when chosen); its arguments are passed through unchanged.

Exit codes: 0 all good, 1 failures found, 2 usage errors or a server that
would not start.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence

from mlxspec.cli.argtypes import positive_int

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
#: Exit status after Ctrl-C (128 + SIGINT, the shell convention).
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m mlxspec.conformance",
        description="Conformance harness: schemathesis fuzzing and mlx_lm.server parity.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    fuzz = sub.add_parser("fuzz", help="fuzz every operation with schemathesis")
    fuzz.add_argument(
        "--examples",
        type=positive_int,
        default=25,
        help="test cases per operation and phase (default 25)",
    )
    fuzz.add_argument(
        "--url",
        default=None,
        help="server origin, e.g. http://127.0.0.1:8080 (default: start mlxspec serve "
        "on the embedded default model)",
    )
    fuzz.add_argument("--seed", type=int, default=1, help="hypothesis seed (default 1)")
    fuzz.add_argument(
        "--coverage",
        action="store_true",
        help="add schemathesis' coverage phase (boundary values; several hundred "
        "extra cases per generation route)",
    )
    fuzz.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="outer wall-clock limit in seconds (default: 900, or 3600 with --coverage)",
    )
    fuzz.add_argument(
        "--workers", type=positive_int, default=1, help="concurrent schemathesis workers"
    )
    fuzz.add_argument(
        "--verbose", action="store_true", help="print schemathesis' output even when all passed"
    )
    sub.add_parser(
        "parity",
        add_help=False,
        help="compare against mlx_lm.server (arguments go to the parity harness)",
    )
    return parser


def _fuzz(args: argparse.Namespace) -> int:
    from contextlib import nullcontext

    from mlxspec.conformance.fuzz import DEFAULT_PHASES, FuzzOptions, run_fuzz, served_default_model

    phases = DEFAULT_PHASES + (("coverage",) if args.coverage else ())
    limit = args.time_limit or (3600.0 if args.coverage else 900.0)
    server = nullcontext(args.url) if args.url else served_default_model()
    try:
        with server as base:
            print(
                f"fuzzing {base} ({args.examples} examples/operation, seed {args.seed})", flush=True
            )
            result = run_fuzz(
                FuzzOptions(
                    base_url=base,
                    max_examples=args.examples,
                    seed=args.seed,
                    phases=phases,
                    time_limit=limit,
                    workers=args.workers,
                )
            )
    except RuntimeError as exc:
        print(f"mlxspec.conformance: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # Ctrl-C also stops the server, so schemathesis' last cases fail with
        # "Server Unavailable": that is an interrupted run, not a finding.
        print("fuzz interrupted: no verdict", file=sys.stderr)
        return EXIT_INTERRUPTED
    if args.verbose or not result.ok:
        print(result.output)
    print(result.summary())
    return EXIT_OK if result.ok else EXIT_FAILED


def _parity(argv: Sequence[str]) -> int:
    try:
        from mlxspec.conformance.parity import main as parity_main
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}.parity":
            raise
        print("parity harness not available", file=sys.stderr)
        return EXIT_USAGE
    return int(parity_main(list(argv)) or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Run a subcommand and return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "parity":
        return _parity(argv[1:])
    args = _parser().parse_args(argv)
    return _fuzz(args)


if __name__ == "__main__":
    # SIGTERM becomes SystemExit so the `finally` blocks stop the servers we started.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    sys.exit(main())

"""The model library's commands: ``mlxspec ls``, ``download``, ``rm``, ``gc``, ``fit``.

Thin wrappers over :mod:`mlxspec.library` (the same scan, fit model, GC plan and
downloader the server's ``/library`` routes use). Ollama's ``list``/``pull``/``rm``,
``git gc``'s print-then-confirm.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

#: The subcommands this module runs.
COMMANDS = frozenset({"ls", "download", "rm", "gc", "fit"})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mlxspec", description="the local model library")
    sub = parser.add_subparsers(dest="command", required=True)
    ls = sub.add_parser("ls", help="list the models on disk with their fit")
    ls.add_argument("--json", action="store_true", help="print /library's rows as JSON")
    dl = sub.add_parser("download", help="download a model from the Hugging Face hub")
    dl.add_argument("repo", help="org/name")
    dl.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATTERN",
        help="another file pattern to fetch (repeatable); weights, config, tokenizer "
        "and templates are always fetched",
    )
    rm = sub.add_parser("rm", help="delete a model from the hub cache")
    rm.add_argument("repo", help="org/name")
    gc = sub.add_parser("gc", help="print what a GC of the hub cache frees; --yes deletes it")
    gc.add_argument("--yes", action="store_true", help="delete what the plan names")
    fit = sub.add_parser("fit", help="how a model on disk fits this machine")
    fit.add_argument("model", help="a repo id in the library, or a model folder")
    fit.add_argument("--context", type=int, default=None, help="the context wanted, tokens")
    fit.add_argument("--json", action="store_true", help="print the assessment as JSON")
    return parser


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"


def _table(rows: list[list[str]], out: TextIO) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() + "\n")


def cmd_ls(args: argparse.Namespace, out: TextIO) -> int:
    """``mlxspec ls``: repo, type, size, quant, fits, serving (a table; ``--json``)."""
    from mlxspec.library import Registry

    rows = Registry(ttl=0).library()
    if args.json:
        out.write(json.dumps({"models": rows}, indent=2) + "\n")
        return 0
    table = [["REPO", "TYPE", "SIZE", "QUANT", "FITS", "CONTEXT", "SUPPORTED", "SERVING"]]
    for r in rows:
        a = r["assessment"]
        quant = f"{r['quant_bits']}-bit/{r['quant_group_size']}" if r["quant_bits"] else "-"
        table.append(
            [
                r["repo_id"],
                r["model_type"] or "-",
                _size(r["size_bytes"]),
                quant,
                "-" if a is None else ("yes" if a["fits"] else "no"),
                "-" if a is None else str(a["max_safe_context"]),
                r["support_tier"] or "no",
                "yes" if r["serving"] else "-",
            ]
        )
    if len(table) == 1:
        out.write("no models on disk (mlxspec download ORG/NAME fetches one)\n")
        return 0
    _table(table, out)
    return 0


def cmd_download(args: argparse.Namespace, out: TextIO) -> int:
    """``mlxspec download REPO``: a progress line per file; resumable (run it again)."""
    from mlxspec.library import DownloadBusy, Downloads, PathRefused
    from mlxspec.library.downloads import MODEL_FILES

    downloads = Downloads()
    try:
        record = downloads.start(args.repo, (*MODEL_FILES, *args.include))
    except (PathRefused, DownloadBusy) as exc:
        sys.stderr.write(f"mlxspec: error: {exc}\n")
        return 2
    shown: str | None = None
    while record.state == "active":
        row = record.json()
        if row["current_file"] != shown and shown is not None:
            out.write("\n")
        shown = row["current_file"]
        if shown is not None:
            done = f"{_size(row['received_bytes'])} / {_size(row['total_bytes'])}"
            rate = f"{_size(int(row['bytes_per_sec']))}/s"
            counts = f"[{row['files_done'] + 1}/{row['files_total']}]"
            out.write(f"\r{counts} {shown}  {done}  {rate}   ")
            out.flush()
        time.sleep(0.2)
    out.write("\n")
    if record.state != "done":
        sys.stderr.write(f"mlxspec: error: download of {args.repo} failed: {record.error}\n")
        return 1
    out.write(
        f"{args.repo}: {record.files_total} files, {_size(record.total_bytes)} in {record.path}\n"
    )
    return 0


def cmd_rm(args: argparse.Namespace, out: TextIO) -> int:
    """``mlxspec rm REPO``: delete the repo's folder from the hub cache."""
    from mlxspec.library import PathRefused
    from mlxspec.library.gc import remove_repo

    try:
        freed = remove_repo(args.repo)
    except (PathRefused, FileNotFoundError) as exc:
        sys.stderr.write(f"mlxspec: error: {exc}\n")
        return 1
    out.write(f"deleted {args.repo} ({_size(freed)})\n")
    return 0


def cmd_gc(args: argparse.Namespace, out: TextIO) -> int:
    """``mlxspec gc``: print the plan; ``--yes`` deletes exactly a fresh plan."""
    from mlxspec.library import execute_gc, plan_gc

    plan = plan_gc()
    if not plan.repos:
        out.write("nothing to reclaim: no superseded snapshots\n")
        return 0
    table = [["REPO", "PRUNE", "SKIPPED", "DEAD BLOBS", "RECLAIM"]]
    for r in plan.repos:
        table.append(
            [
                r.repo_id,
                str(r.prune_snapshots),
                str(r.skipped_snapshots),
                str(r.dead_blobs),
                _size(r.reclaim_bytes),
            ]
        )
    _table(table, out)
    out.write(f"total: {_size(plan.reclaim_bytes)}\n")
    if not args.yes:
        out.write("nothing deleted: run `mlxspec gc --yes` to delete it\n")
        return 0
    done = execute_gc()
    out.write(
        f"deleted {done['snapshots']} snapshots and {done['blobs']} blobs "
        f"({_size(done['reclaimed_bytes'])})\n"
    )
    return 0


def _fit_row(spec: str) -> Any:
    """The library row of a repo id, or a row read from a model folder."""
    from mlxspec.library import Registry
    from mlxspec.library.scan import folder_row

    found = Registry(ttl=0).find(spec)
    if found is not None:
        return found
    folder = Path(spec).expanduser()
    if (folder / "config.json").is_file():
        return folder_row(folder)
    return None


def cmd_fit(args: argparse.Namespace, out: TextIO) -> int:
    """``mlxspec fit MODEL [--context N]``: the assessment as a table."""
    from mlxspec.library import assess, current_machine
    from mlxspec.library.assess import model_memory, window

    row = _fit_row(args.model)
    if row is None:
        sys.stderr.write(f"mlxspec: error: {args.model} is neither a library model nor a folder\n")
        return 1
    machine = current_machine()
    found = assess(row, machine, args.context)
    memory = model_memory(row.config, row.weights_bytes)
    if found is None or memory is None:
        sys.stderr.write(f"mlxspec: error: {args.model}: its config does not say its shape\n")
        return 1
    body = {
        "model": row.repo_id,
        "weights_bytes": row.weights_bytes,
        "kv_bytes_per_token": memory.kv_bytes_per_token,
        "context_window": window(row.config),
        "usable_bytes": machine.usable_bytes,
        "bandwidth_gbs": round(machine.bandwidth_gbs, 2),
        "context": args.context,
        **found.__dict__,
    }
    if args.json:
        out.write(json.dumps(body, indent=2) + "\n")
    else:
        _table([[k, "-" if v is None else str(v)] for k, v in body.items()], out)
    return 0 if found.fits else 3


def run(argv: Sequence[str], out: TextIO | None = None) -> int:
    """Run one library command (``argv[0]`` in :data:`COMMANDS`); the exit code.

    ``fit`` exits 3 when the model does not fit.
    """
    args = _parser().parse_args(list(argv))
    handler = {
        "ls": cmd_ls,
        "download": cmd_download,
        "rm": cmd_rm,
        "gc": cmd_gc,
        "fit": cmd_fit,
    }[args.command]
    return handler(args, out or sys.stdout)

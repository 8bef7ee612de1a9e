"""Parity with ``mlx_lm.server``: cases, live and recorded runs, the report.

A case (``fixtures/parity/cases/*.json``) is a request (route, body) and the
names of the :data:`~mlxspec.conformance.observe.FIELDS` that must match. *Live* mode starts
``mlx_lm.server`` and ``mlxspec serve`` on the same model folder and sends each
case to both; *recorded* mode compares mlxspec with the responses stored in
``fixtures/parity/reference/`` (``--live --record`` rewrites them), so CI needs
no second server. Fields compare exactly on text, ids and ints and within
``observe.TOLERANCE`` on floats (TGI's integration snapshots do the same). A case
may name a ``deviation`` (a row of ``docs/deviations.md``): its fields may
differ from mlx_lm.server, and ``expect`` pins what mlxspec answers instead.

    python -m mlxspec.conformance parity --live [--record] [--report docs/parity-report.md]
    python -m mlxspec.conformance parity            # recorded mode
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from mlxspec.conformance.live import serve
from mlxspec.conformance.observe import (
    FIELDS,
    TOLERANCE,
    Observed,
    diff,
    parse_sse,
    strip_volatile,
    top_order_violations,
)

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "parity"

NATIVE_WEIGHTS = ("--cpu-weights", "native")
"""mlxspec's flags for parity runs: the checkpoint's own weights and precision, as
mlx_lm.server computes with (float32 CPU weights change logprobs in the third decimal)."""


@dataclass(frozen=True)
class Case:
    """One request sent to both servers.

    Args:
        name (str): unique id, also the recording's file name.
        route (str): path such as ``/v1/chat/completions``.
        body (dict | None): JSON body; ``None`` means ``GET``.
        match (tuple[str, ...]): names of :data:`FIELDS` that must match.
        about (str): one line on what the case shows.
        deviation (dict | None): ``{"row", "fields", "expect"}``: the row of
            docs/deviations.md, the fields it lets differ, and mlxspec's value
            of those fields (checked in every mode).
    """

    name: str
    route: str
    body: dict | None
    match: tuple[str, ...]
    about: str = ""
    deviation: dict | None = None


@dataclass
class Outcome:
    """A case's verdict: ``identical``, ``deviation``, ``differs`` or ``error``."""

    case: str
    route: str
    verdict: str
    fields: list[str] = field(default_factory=list)
    detail: str = ""

    @property
    def ok(self) -> bool:
        """True for ``identical`` and for differences listed as deviations."""
        return self.verdict in ("identical", "deviation")


def load_cases(root: Path = FIXTURES) -> list[Case]:
    """Read every case file under ``root/cases`` (each a JSON list), in file order."""
    cases = []
    for path in sorted((root / "cases").glob("*.json")):
        for raw in json.loads(path.read_text()):
            cases.append(
                Case(
                    name=raw["name"],
                    route=raw["route"],
                    body=raw.get("body"),
                    match=tuple(raw["match"]),
                    about=raw.get("about", ""),
                    deviation=raw.get("deviation"),
                )
            )
    return cases


# Observing a response -------------------------------------------------------


def fetch(client: httpx.Client, base: str, case: Case) -> Observed:
    """Send ``case`` to the server at ``base`` and record what came back.

    Returns:
        Observed: ``status``, ``content_type``; ``events`` and ``done`` for
        SSE, else ``json`` (volatile keys dropped) and, for short bodies, ``text``.
    """
    method = "GET" if case.body is None else "POST"
    with client.stream(method, base + case.route, json=case.body) as r:
        raw = r.read().decode("utf-8", "replace")
    ctype = r.headers.get("content-type", "").split(";")[0].strip().lower()
    out: Observed = {"status": r.status_code, "content_type": ctype}
    if ctype == "text/event-stream":
        out["events"], out["done"] = parse_sse(raw)
        return out
    try:
        out["json"] = strip_volatile(json.loads(raw))
    except ValueError:
        out["json"] = None
    if len(raw) <= 512:
        out["text"] = raw
    return out


def check(case: Case, ours: Observed, ref: Observed) -> Outcome:
    """Compare one case's fields; a difference is fine only in the fields its
    deviation lists, and then mlxspec must answer the deviation's ``expect``."""
    dev = case.deviation or {}
    allowed, expect = set(dev.get("fields", ())), dev.get("expect", {})
    differing, details, unexpected = [], [], []
    for name in case.match:
        d = diff(FIELDS[name](ours), FIELDS[name](ref))
        if d:
            differing.append(name)
            if name not in allowed:
                unexpected.append(name)
                details.append(name + (d[0][1:] if d[0].startswith(".:") else d[0]))
    for name, value in expect.items():
        d = diff(FIELDS[name](ours), value)
        if d:
            unexpected.append(f"{name} (expected)")
            details.append(f"{name} vs expected: {d[0]}")
    if "top_logprobs" in case.match and (bad := top_order_violations(ours)):
        unexpected.append("top_order")
        details.append(bad[0])
    if unexpected:
        return Outcome(case.name, case.route, "differs", unexpected, "; ".join(details))
    if differing:
        return Outcome(case.name, case.route, "deviation", differing, dev.get("row", ""))
    return Outcome(case.name, case.route, "identical")


# Recordings ----------------------------------------------------------------


def reference_path(case: Case, root: Path = FIXTURES) -> Path:
    """Where ``case``'s mlx_lm.server response is recorded."""
    return root / "reference" / f"{case.name}.json"


def save_reference(case: Case, observed: Observed, meta: dict, root: Path = FIXTURES) -> None:
    """Write mlx_lm.server's response to ``case`` with the request and run metadata."""
    path = reference_path(case, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {**meta, "request": {"route": case.route, "body": case.body}, "response": observed}
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")


def load_reference(case: Case, root: Path = FIXTURES) -> Observed:
    """The recorded response for ``case``.

    Raises:
        LookupError: no recording, or one made for a different request.
    """
    path = reference_path(case, root)
    if not path.exists():
        raise LookupError("no recording (run parity --live --record)")
    record = json.loads(path.read_text())
    if record["request"] != {"route": case.route, "body": case.body}:
        raise LookupError("recording is for another request (run parity --live --record)")
    return record["response"]


def check_recorded(client: httpx.Client, base: str, case: Case, root: Path = FIXTURES) -> Outcome:
    """Send ``case`` to mlxspec at ``base`` and compare with its recording."""
    try:
        ref = load_reference(case, root)
    except LookupError as exc:
        return Outcome(case.name, case.route, "error", [], str(exc))
    return check(case, fetch(client, base, case), ref)


# Servers -------------------------------------------------------------------


def offline_env(hf_cache: str) -> dict[str, str]:
    """Environment with the Hugging Face hub offline and an empty hub cache
    (mlx_lm.server's ``/v1/models`` scans it, and fails if it is missing)."""
    return {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_CACHE": hf_cache,
    }


def mlx_lm_version() -> str:
    """The installed mlx-lm version."""
    from mlx_lm import __version__

    return __version__


# Runs and reports ------------------------------------------------------------


def run_live(
    cases: Sequence[Case],
    model: Path,
    record: bool,
    ref_url: str | None = None,
    ours_url: str | None = None,
    root: Path = FIXTURES,
    server_args: Sequence[str] = (),
) -> list[Outcome]:
    """Start mlx_lm.server and mlxspec on ``model`` (unless URLs are given), send
    every case to both (mlx_lm.server first) and compare; ``record`` stores mlx-lm's
    answers. ``server_args`` are more mlx_lm.server flags, given to both servers."""
    meta = {
        "mlx_lm_version": mlx_lm_version(),
        "model": model.name,
        "recorded": dt.date.today().isoformat(),
    }
    line = ["--model", str(model), "--host", "127.0.0.1", "--port", "{port}", *server_args]
    outcomes = []
    for case, ours, ref in fetch_both(cases, line, ref_url, ours_url):
        if record:
            save_reference(case, ref, meta, root)
        outcomes.append(check(case, ours, ref))
        print(f"  {case.name}: {outcomes[-1].verdict}", file=sys.stderr, flush=True)
    return outcomes


def fetch_both(
    cases: Sequence[Case],
    line: Sequence[str],
    ref_url: str | None = None,
    ours_url: str | None = None,
) -> Iterator[tuple[Case, Observed, Observed]]:
    """Start ``mlx_lm.server LINE`` and ``mlxspec serve LINE --cpu-weights native``
    (one mlx_lm.server command line, both servers: ``{port}`` in it is each one's
    free port) unless their URLs are given, and send each case to both,
    mlx_lm.server first.

    Args:
        cases (Sequence[Case]): the requests.
        line (Sequence[str]): mlx_lm.server's flags, ``--model`` included.
        ref_url (str | None): a running mlx_lm.server instead. Default: ``None``.
        ours_url (str | None): a running mlxspec instead. Default: ``None``.

    Yields:
        tuple[Case, Observed, Observed]: each case with mlxspec's and mlx_lm.server's
        answers; the servers stop when the iteration ends.

    Raises:
        RuntimeError: a server exited or never became healthy (with its log tail).
    """
    with ExitStack() as stack, httpx.Client(timeout=600) as client:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
        (tmp / "hub").mkdir()
        env = offline_env(str(tmp / "hub"))
        py = sys.executable
        if ref_url is None:
            argv = [py, "-m", "mlx_lm", "server", *line]
            ref_url = stack.enter_context(serve(argv, env, tmp / "mlx_lm.log"))
        if ours_url is None:
            argv = [py, "-m", "mlxspec", "serve", *line, *NATIVE_WEIGHTS]
            ours_url = stack.enter_context(serve(argv, env, tmp / "mlxspec.log"))
        for case in cases:
            ref = fetch(client, ref_url, case)
            yield case, fetch(client, ours_url, case), ref


def run_recorded(
    cases: Sequence[Case], ours_url: str | None = None, root: Path = FIXTURES
) -> list[Outcome]:
    """Compare mlxspec (started with the embedded default model unless
    ``ours_url`` is given) with the recordings."""
    with ExitStack() as stack, httpx.Client(timeout=600) as client:
        if ours_url is None:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            (tmp / "hub").mkdir()
            ours_url = stack.enter_context(
                serve(
                    [sys.executable, "-m", "mlxspec", "serve", "--port", "{port}", *NATIVE_WEIGHTS],
                    offline_env(str(tmp / "hub")),
                    tmp / "mlxspec.log",
                )
            )
        return [check_recorded(client, ours_url, case, root) for case in cases]


def table(outcomes: Sequence[Outcome]) -> str:
    """The outcomes as a Markdown table: case, route, result."""
    lines = ["| case | route | result |", "| --- | --- | --- |"]
    for o in outcomes:
        if o.verdict == "identical":
            result = "identical"
        elif o.verdict == "deviation":
            result = f"deviation ({o.detail}): {', '.join(o.fields)}"
        else:
            result = f"**{o.verdict.upper()}**: {', '.join(o.fields)} {o.detail}".strip()
        cell = result.replace("|", r"\|")
        lines.append(f"| {o.case} | `{o.route}` | {cell} |")
    return "\n".join(lines)


def summary(outcomes: Sequence[Outcome]) -> str:
    """``N cases: a identical, b deviations, c differ, d errors``."""
    count = {
        v: sum(o.verdict == v for o in outcomes)
        for v in ("identical", "deviation", "differs", "error")
    }
    return (
        f"{len(outcomes)} cases: {count['identical']} identical, {count['deviation']} listed "
        f"deviations, {count['differs']} differ, {count['error']} errors"
    )


def main(argv: list[str] | None = None) -> int:
    """``parity`` subcommand: run the cases live or against the recordings,
    print the table; exit 1 when any case differs or fails."""
    p = argparse.ArgumentParser(
        prog="python -m mlxspec.conformance parity",
        description="Compare mlxspec with mlx_lm.server.",
    )
    p.add_argument("--live", action="store_true", help="start mlx_lm.server too and compare live")
    p.add_argument("--record", action="store_true", help="with --live: rewrite the recordings")
    p.add_argument("--model", type=Path, help="MLX model folder (default: the embedded default)")
    p.add_argument("--fixtures", type=Path, default=FIXTURES, help="cases/ and reference/ root")
    p.add_argument(
        "--only",
        nargs="+",
        metavar="CASE",
        help='run only these cases (the "name" fields of fixtures/parity/cases/*.json)',
    )
    p.add_argument("--mlx-lm-url", help="use a running mlx_lm.server instead of starting one")
    p.add_argument("--mlxspec-url", help="use a running mlxspec instead of starting one")
    p.add_argument("--report", type=Path, help="also write the table as a Markdown report")
    p.add_argument(
        "--server-args",
        default="",
        metavar="FLAGS",
        help="with --live: more mlx_lm.server flags, given to both servers "
        '(e.g. "--temp 0 --max-tokens 64 --adapter-path adapters")',
    )
    args = p.parse_args(argv)
    if args.record and not args.live:
        p.error("--record needs --live")
    cases = load_cases(args.fixtures)
    if args.only:
        unknown = sorted(set(args.only) - {c.name for c in cases})
        if unknown:
            p.error(
                f"unknown case(s): {', '.join(unknown)}; known: {', '.join(c.name for c in cases)}"
            )
        cases = [c for c in cases if c.name in set(args.only)]
    try:
        outcomes, mode = _run(args, cases)
    except (RuntimeError, TimeoutError) as exc:  # a server that would not start
        print(f"parity: error: {exc}", file=sys.stderr)
        return 2
    print(table(outcomes))
    print(f"\n{summary(outcomes)} ({mode})")
    if args.report:
        args.report.write_text(report(outcomes, mode, cases))
    return 0 if all(o.ok for o in outcomes) else 1


def _run(args: argparse.Namespace, cases: list[Case]) -> tuple[list[Outcome], str]:
    if args.live:
        model, about = args.model, f"`{args.model}`"
        if model is None:
            from mlxspec.engine.model.loader import resolve_model

            resolved = resolve_model(None)
            model = resolved.path
            about = f"{resolved.model_id} (embedded default, folder `{model.name}`)"
        outcomes = run_live(
            cases,
            Path(model),
            args.record,
            args.mlx_lm_url,
            args.mlxspec_url,
            args.fixtures,
            shlex.split(args.server_args),
        )
        mode = f"live against mlx_lm.server {mlx_lm_version()}, model {about}"
    else:
        outcomes = run_recorded(cases, args.mlxspec_url, args.fixtures)
        mode = "recorded references"
    return outcomes, mode


def report(outcomes: Sequence[Outcome], mode: str, cases: Sequence[Case] = ()) -> str:
    """The Markdown report committed as ``docs/parity-report.md``: the table,
    then what each listed deviation case shows."""
    about = {c.name: c.about for c in cases}
    notes = [
        f"- `{o.case}` ({o.detail}): {about.get(o.case, '')}"
        for o in outcomes
        if o.verdict == "deviation"
    ]
    return (
        f"# Parity with mlx_lm.server\n\nRun {dt.date.today().isoformat()}, {mode}.\n"
        "Generated by `python -m mlxspec.conformance parity --live --report "
        "docs/parity-report.md`. Both servers ran on the same converted model folder, "
        "greedy (`temperature: 0`) with an explicit `max_tokens`; text, token ids and "
        f"counts must be equal and logprob values within {TOLERANCE} "
        "(`mlxspec/conformance/observe.py`). mlx_lm.server decodes unseeded requests with "
        "its `BatchGenerator` and seeded ones (`chat_seeded`) with `generate_step`. "
        "Deviations are rows of `docs/deviations.md`.\n\n"
        f"{summary(outcomes)}.\n\n{table(outcomes)}\n"
        + ("\n## Listed deviations\n\n" + "\n".join(notes) + "\n" if notes else "")
    )

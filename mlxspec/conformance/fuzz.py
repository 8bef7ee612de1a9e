"""schemathesis fuzzing of a live mlxspec server against its own OpenAPI document.

:func:`run_fuzz` runs the schemathesis CLI (``schemathesis run``) in a
subprocess against ``<base_url>/openapi.json``: every operation, checked with
:data:`CHECKS`, seeded and bounded by ``max_examples`` per operation, under an
outer wall-clock limit (schemathesis' own ``--max-time`` is a budget that
fuzzing fills, not a cap). A subprocess keeps the global hooks of
:mod:`mlxspec.conformance.hooks` (which cap ``max_tokens``) out of the caller's
process and makes the time limit enforceable. Output sanitising is off, or
schemathesis would print every ``*_tokens`` field as ``[Filtered]``.

:func:`served_default_model` starts ``mlxspec serve`` on the embedded default
model, as ``tests/real/conftest.py``'s ``real_server`` does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlxspec.conformance.live import serve

#: schemathesis checks every run applies (schemathesis 4.32 names).
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "response_headers_conformance",
)
#: The hooks module, loaded by schemathesis through ``SCHEMATHESIS_HOOKS``.
HOOKS_MODULE = "mlxspec.conformance.hooks"
#: Phases of the bounded pass. ``coverage`` adds several hundred boundary cases
#: per generation route whatever ``max_examples`` says; opt in for long runs.
DEFAULT_PHASES = ("examples", "fuzzing")
#: The directory that holds the ``mlxspec`` package (for subprocess imports).
PACKAGE_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class FuzzOptions:
    """How to fuzz.

    Args:
        base_url (str): the server's origin, e.g. ``http://127.0.0.1:8080``.
        max_examples (int): test cases per operation and phase. Default: ``25``.
        seed (int): hypothesis seed, for reproducible runs. Default: ``1``.
        phases (tuple[str, ...]): schemathesis phases. Default: :data:`DEFAULT_PHASES`.
        time_limit (float): outer wall-clock limit in seconds. Default: ``900``.
        request_timeout (float): per-request timeout in seconds. Default: ``60``.
        workers (int): concurrent schemathesis workers. Default: ``1``.
        shrink (bool): shrink failing cases to minimal ones (more requests,
            clearer reports). Default: ``True``.
    """

    base_url: str
    max_examples: int = 25
    seed: int = 1
    phases: tuple[str, ...] = DEFAULT_PHASES
    time_limit: float = 900.0
    request_timeout: float = 60.0
    workers: int = 1
    shrink: bool = True


@dataclass(frozen=True)
class FailureGroup:
    """One kind of failure schemathesis found (its report groups them).

    Args:
        title (str): e.g. ``Server error`` or ``Response violates schema``.
        code (str | None): schemathesis' failure code, e.g. ``ST101``.
        count (int): failing cases in the group.
        operations (tuple[str, ...]): e.g. ``("POST /v1/chat/completions",)``.
    """

    title: str
    code: str | None
    count: int
    operations: tuple[str, ...] = ()


@dataclass(frozen=True)
class FuzzResult:
    """The outcome of one run.

    Args:
        exit_code (int | None): schemathesis' exit code; ``None`` if it was killed.
        duration (float): wall-clock seconds.
        cases (int): test cases generated (and sent).
        operations (int): operations tested.
        failures (tuple[FailureGroup, ...]): failed checks, grouped.
        errors (tuple[str, ...]): errors that stopped cases from running.
        timed_out (bool): the outer limit killed the run.
        output (str): schemathesis' console output (failures with curl repros).
    """

    exit_code: int | None
    duration: float
    cases: int = 0
    operations: int = 0
    failures: tuple[FailureGroup, ...] = ()
    errors: tuple[str, ...] = ()
    timed_out: bool = False
    output: str = ""
    options: FuzzOptions | None = field(default=None, repr=False)

    @property
    def ok(self) -> bool:
        """No failure, no error, not killed, and something was tested."""
        return (
            self.exit_code == 0
            and not self.timed_out
            and not self.failures
            and not self.errors
            and self.cases > 0
        )

    def summary(self) -> str:
        """A few lines: counts, then one line per failure group or error."""
        verdict = "ok" if self.ok else "FAILED"
        per_op = f", {self.options.max_examples} examples/operation" if self.options else ""
        seed = f", seed {self.options.seed}" if self.options else ""
        failures = sum(f.count for f in self.failures)
        lines = [
            f"fuzz {verdict}: {_plural(self.operations, 'operation')}, "
            f"{_plural(self.cases, 'case')}, {_plural(failures, 'failure')} "
            f"in {self.duration:.1f}s{per_op}{seed}"
        ]
        if self.timed_out:
            lines.append(
                f"  killed after the {self.options.time_limit if self.options else '?'}s limit"
            )
        for group in self.failures:
            ops = ", ".join(group.operations)
            lines.append(f"  [{group.code}] {group.title}: {group.count} case(s) in {ops}")
        lines += [f"  error: {e}" for e in self.errors]
        if self.exit_code not in (0, 1, None):
            lines.append(f"  schemathesis exited with {self.exit_code}")
        return "\n".join(lines)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def build_command(options: FuzzOptions, report: Path) -> list[str]:
    """The ``schemathesis run`` command line for ``options``.

    Args:
        options (FuzzOptions): the run's settings.
        report (Path): where schemathesis writes its JSON run report.

    Returns:
        list[str]: argv, starting with this interpreter.
    """
    base = options.base_url.rstrip("/")
    optional = [] if options.shrink else ["--no-shrink"]
    return [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{base}/openapi.json",
        "--url",
        base,
        "--checks",
        ",".join(CHECKS),
        "--phases",
        ",".join(options.phases),
        "--max-examples",
        str(options.max_examples),
        "--seed",
        str(options.seed),
        "--workers",
        str(options.workers),
        "--request-timeout",
        str(options.request_timeout),
        "--generation-database",
        "none",
        # a generation health check, not a finding about the server: the hooks' filter
        # (header values http.client cannot send) can reject most of one operation's
        # examples for a seed, as it did for addSessionAudio once the document grew
        "--suppress-health-check",
        "filter_too_much",
        "--output-sanitize",
        "false",
        "--no-color",
        "--report",
        "json",
        "--report-json-path",
        str(report),
        *optional,
    ]


def _environment() -> dict[str, str]:
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "SCHEMATHESIS_HOOKS": HOOKS_MODULE,
        "PYTHONPATH": str(PACKAGE_ROOT) + (os.pathsep + path if path else ""),
    }


def run_fuzz(options: FuzzOptions) -> FuzzResult:
    """Fuzz the live server at ``options.base_url``.

    Args:
        options (FuzzOptions): the run's settings.

    Returns:
        FuzzResult: counts and failures; ``result.ok`` is the verdict.
    """
    with tempfile.TemporaryDirectory(prefix="mlxspec-fuzz-") as tmp:
        report = Path(tmp) / "report.json"
        start = time.monotonic()
        proc = subprocess.Popen(
            build_command(options, report),
            cwd=tmp,  # schemathesis writes caches under the working directory
            env=_environment(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
        )
        timed_out = False
        try:
            output, _ = proc.communicate(timeout=options.time_limit)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.kill()
            output, _ = proc.communicate()
        except BaseException:  # Ctrl-C / SIGTERM: leave no schemathesis behind
            proc.kill()
            proc.wait()
            raise
        duration = time.monotonic() - start
        doc = _read_report(report)
    return _result(
        doc, proc.returncode if not timed_out else None, duration, timed_out, output, options
    )


def _read_report(path: Path) -> dict:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _result(
    doc: dict,
    exit_code: int | None,
    duration: float,
    timed_out: bool,
    output: str,
    options: FuzzOptions,
) -> FuzzResult:
    cases = (doc.get("test_cases") or {}).get("generated", 0)
    operations = (doc.get("operations") or {}).get("tested", 0)
    failures = tuple(
        FailureGroup(
            title=str(f.get("title")),
            code=f.get("code"),
            count=int(f.get("count") or 0),
            operations=tuple(f.get("operations") or ()),
        )
        for f in doc.get("failures") or ()
    )
    errors = tuple(f"{e.get('title')} (x{e.get('count')})" for e in doc.get("errors") or ())
    if not doc and not timed_out:
        errors += ("schemathesis wrote no report",)
    return FuzzResult(
        exit_code=exit_code,
        duration=duration,
        cases=int(cases),
        operations=int(operations),
        failures=failures,
        errors=errors,
        timed_out=timed_out,
        output=output,
        options=options,
    )


@contextmanager
def served_default_model(
    extra_args: Sequence[str] = (), startup_timeout: float = 300.0
) -> Iterator[str]:
    """Run ``mlxspec serve`` on the embedded default model for the ``with`` block.

    Args:
        extra_args (Sequence[str]): more ``serve`` flags. Default: none.
        startup_timeout (float): seconds to wait for ``/health`` (the first run
            converts the GGUF). Default: ``300``.

    Yields:
        str: the base URL, ``http://127.0.0.1:<port>``.

    Raises:
        RuntimeError: the server exited or never became healthy (with its log tail).
    """
    env = {**_environment(), "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1")}
    env.pop("SCHEMATHESIS_HOOKS")
    with tempfile.TemporaryDirectory() as tmp:
        # an empty hub cache: fuzzed /api/gc/execute and /api/hub/download touch only it
        env["HF_HUB_CACHE"] = str(Path(tmp) / "hub")
        argv = [sys.executable, "-m", "mlxspec", "serve", "--port", "{port}", *extra_args]
        with serve(argv, env, Path(tmp) / "serve.log", startup_timeout) as base:
            yield base

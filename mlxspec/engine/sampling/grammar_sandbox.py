"""Compile untrusted grammars in a child process first.

xgrammar's C++ compiler crashes the whole process on some inputs (for example
the EBNF ``root ::= root{2,}`` segfaults in xgrammar 0.2.9), and a grammar is
client input. :class:`CompileSandbox` compiles each new constraint once in a
long-lived child process (this file run as a script: stdlib and xgrammar only,
one JSON line per request and per answer); only a constraint that compiled
there is compiled again, in-process, by :class:`~.grammar.GrammarCache`. A
child that crashes or runs past the timeout is killed and restarted, and the
constraint gets a reason, so the request takes the degrade path instead of
taking the server down.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import re
import select
import subprocess
import sys
import threading
from collections.abc import Iterable
from typing import Any

#: xgrammar's C++ errors start with ``[hh:mm:ss] /path/file.cc:123: ``; that
#: prefix tells a client nothing.
_CPP_PREFIX = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")


def error_reason(exc: BaseException) -> str:
    """A one-line, path-free description of a compile error, safe to show."""
    text = " ".join(_CPP_PREFIX.sub("", str(exc)).split())
    return text or type(exc).__name__


def choice_ebnf(choices: Iterable[str]) -> str:
    """An EBNF grammar whose language is exactly ``choices``.

    JSON string syntax (``ensure_ascii=False``) is also xgrammar's EBNF literal
    syntax for the escapes it produces (``\\"``, ``\\\\``, ``\\n``, ``\\uXXXX``).

    Args:
        choices (Iterable[str]): the allowed outputs.

    Returns:
        str: ``root ::= "a" | "b" | ...``.
    """
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def compile_spec(compiler: Any, kind: str, spec: str, any_whitespace: bool) -> Any:
    """Compile one constraint with an ``xgrammar.GrammarCompiler``.

    Args:
        compiler: the compiler (bound to the served tokenizer).
        kind (str): a :data:`~.types.ConstraintKind`.
        spec (str): the constraint's text (see :class:`~.types.Constraint`).
        any_whitespace (bool): JSON whitespace freedom (schema kinds).

    Returns:
        xgrammar.CompiledGrammar

    Raises:
        ValueError: a malformed choice list or an unknown kind.
        Exception: whatever xgrammar raises for a grammar it rejects.
    """
    if kind == "json_object":
        return compiler.compile_builtin_json_grammar()
    if kind == "json_schema":
        return compiler.compile_json_schema(spec, any_whitespace=any_whitespace)
    if kind == "regex":
        return compiler.compile_regex(spec)
    if kind == "ebnf":
        return compiler.compile_grammar(spec)
    if kind == "choice":
        try:
            choices = json.loads(spec)
        except ValueError:
            choices = None
        if (
            not isinstance(choices, list)
            or not choices
            or not all(isinstance(c, str) for c in choices)
        ):
            raise ValueError("choice constraint is not a non-empty JSON array of strings")
        return compiler.compile_grammar(choice_ebnf(choices))
    if kind == "structural_tag":
        return compiler.compile_structural_tag(spec)
    raise ValueError(f"unknown constraint kind {kind!r}")


class CompileSandbox:
    """A child process that test-compiles constraints (thread-safe, one at a time).

    Args:
        tokenizer_info (str): ``xgrammar.TokenizerInfo.serialize_json()`` of the
            served tokenizer.
        timeout (float): seconds one compile may take. Default: ``30``.
    """

    def __init__(self, tokenizer_info: str, timeout: float = 30.0) -> None:
        self._info = tokenizer_info
        self.timeout = timeout
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()

    def check(self, kind: str, spec: str, any_whitespace: bool) -> str | None:
        """Compile in the child; ``None`` if it compiles, else the reason.

        A crash or a timeout kills the child (restarted on the next call) and
        is reported as the reason.
        """
        request = json.dumps({"kind": kind, "spec": spec, "any_whitespace": any_whitespace})
        with self._lock:
            proc = self._start()
            try:
                assert proc.stdin is not None and proc.stdout is not None
                proc.stdin.write(request + "\n")
                proc.stdin.flush()
                ready, _, _ = select.select([proc.stdout], [], [], self.timeout)
                line = proc.stdout.readline() if ready else None
            except OSError:
                line = ""
            if line:
                return json.loads(line)["reason"]
            self._stop()
        if line is None:
            return f"grammar compilation took longer than {self.timeout:g} s"
        return "the grammar compiler crashed on this grammar"

    def close(self) -> None:
        """Stop the child (it also exits by itself when this process ends)."""
        with self._lock:
            self._stop()

    def _start(self) -> subprocess.Popen[str]:
        if self._proc is None or self._proc.poll() is not None:
            self._proc = subprocess.Popen(
                # -P: the script's folder (which holds a types.py) stays off sys.path.
                [sys.executable, "-P", __file__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,  # xgrammar's warnings: the parent logs reasons
                text=True,
            )
            assert self._proc.stdin is not None
            self._proc.stdin.write(json.dumps(self._info) + "\n")
            self._proc.stdin.flush()
        return self._proc

    def _stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            for pipe in (self._proc.stdin, self._proc.stdout):
                if pipe is not None:
                    try:
                        pipe.close()
                    except OSError:  # the child is gone: a buffered write cannot flush
                        pass
            self._proc = None


_shared: dict[str, CompileSandbox] = {}
_shared_lock = threading.Lock()


def shared_sandbox(tokenizer_info: str) -> CompileSandbox:
    """The process-wide sandbox for a tokenizer (engines on one model share one child)."""
    key = hashlib.sha256(tokenizer_info.encode()).hexdigest()
    with _shared_lock:
        if key not in _shared:
            _shared[key] = CompileSandbox(tokenizer_info)
        return _shared[key]


@atexit.register
def _close_shared() -> None:
    for sandbox in _shared.values():
        sandbox.close()


def _serve() -> None:
    """Child side: first line the tokenizer info, then one request per line."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.deserialize_json(json.loads(sys.stdin.readline()))
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    for line in sys.stdin:
        req = json.loads(line)
        try:
            compile_spec(compiler, req["kind"], req["spec"], req["any_whitespace"])
            reason = None
        except Exception as exc:  # xgrammar raises RuntimeError, ValueError, its own types
            reason = error_reason(exc)
        sys.stdout.write(json.dumps({"reason": reason}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()

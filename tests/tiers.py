"""The test tiers: which tests are ``fast``, decided at collection, and a guard
that fails a ``fast`` test that starts a process anyway.

A test is *heavy* (not ``fast``) when it needs one of the expensive things
below; it then carries that reason's marker, and every other test carries
``fast`` (``pytest -m fast`` runs them; docs/testing.md has the rule):

- ``real_model``: the embedded SmolLM2-135M (everything under ``tests/real/``,
  or code that resolves the embedded model or uses ``real_server``);
- ``browser``: Chromium (everything under ``tests/browser/``, or code that
  drives Playwright);
- ``subprocess``: a process of its own: ``mlxspec serve``, an agent CLI, a
  converter, any ``subprocess``/``Popen`` call.

The reasons are found without anyone adding a marker: :func:`heavy_reasons`
reads the code of the test and of every fixture it uses (transitively, and the
helper functions under ``tests/``, ``fixtures/`` and ``mlxspec/conformance/``
they call by name or as ``module.function``) for the names in :data:`HEAVY_NAMES` and the objects in
:data:`HEAVY_OBJECTS`. A marker written by hand (``@pytest.mark.subprocess``)
counts too. :class:`SpawnGuard` is the net under that reading: a ``fast``
test (its fixtures' setup included) that starts a process fails, naming it.
"""

from __future__ import annotations

import dis
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from mlxspec.conformance import live

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

#: marker -> what it means (registered in pytest_configure, listed by ``pytest --markers``).
MARKERS = {
    "fast": "no real model, no subprocess, no browser: the tier run after every change "
    "(set at collection by tests/tiers.py; select with -m fast)",
    "real_model": "uses the embedded SmolLM2-135M model (slow on CPU)",
    "subprocess": "starts a process (mlxspec serve, an agent CLI, a converter)",
    "browser": "drives Chromium through Playwright",
}
HEAVY = ("real_model", "subprocess", "browser")

#: Folders whose every test is heavy for one reason.
HEAVY_DIRS = {TESTS / "real": "real_model", TESTS / "browser": "browser"}

#: A name a test, a fixture or a helper uses -> the reason it makes the test heavy.
#: A name that is bound to one of these objects counts whatever it is called.
HEAVY_NAMES = {
    "subprocess": "subprocess",
    "Popen": "subprocess",
    "create_subprocess_exec": "subprocess",
    "create_subprocess_shell": "subprocess",
    "real_server": "real_model",
    "find_embedded_gguf": "real_model",
    "resolve_model": "real_model",
    # Whisper's worker process beside a chat model (engine/audio/remote.py)
    "WhisperProcess": "subprocess",
    "sync_playwright": "browser",
    "async_playwright": "browser",
}
#: Objects that make a caller heavy under any name (``from ... import serve``).
HEAVY_OBJECTS = {
    id(live.serve): "subprocess",
    id(subprocess): "subprocess",
    id(subprocess.Popen): "subprocess",
    id(subprocess.run): "subprocess",
}
#: How deep the reading follows helpers called by name.
DEPTH = 4


#: Where the reading follows the functions a test calls: the test code, the model
#: builders and mlxspec's conformance tooling (which starts servers and schemathesis).
FOLLOWED = (TESTS, ROOT / "fixtures", ROOT / "mlxspec" / "conformance")


def _own(obj: Any) -> bool:
    """Whether ``obj`` is a function defined under one of :data:`FOLLOWED`."""
    code = getattr(obj, "__code__", None)
    if code is None:
        return False
    return any(folder in Path(code.co_filename).parents for folder in FOLLOWED)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """``code`` and every code object nested in it (closures, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _bound_names(code: types.CodeType, namespace: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    """Each name ``code`` uses with what it is bound to in ``namespace`` (``None``
    if nothing), and each ``module.attr`` it loads with that attribute's object."""
    last: Any = None
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            last = namespace.get(ins.argval)
            yield ins.argval, last
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and last is not None:
            last = getattr(last, ins.argval, None)
            yield ins.argval, last
        elif ins.opname in ("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE", "IMPORT_NAME"):
            last = None
            yield ins.argval, None
        else:
            last = None


@functools.cache
def _reasons_of_code(code: types.CodeType, globals_id: int, depth: int) -> frozenset[str]:
    found: set[str] = set()
    namespace = _GLOBALS[globals_id]
    for inner in _codes(code):
        for name in inner.co_varnames:
            if name in HEAVY_NAMES:
                found.add(HEAVY_NAMES[name])
        for name, bound in _bound_names(inner, namespace):
            if name in HEAVY_NAMES:
                found.add(HEAVY_NAMES[name])
            if bound is None:
                continue
            if id(bound) in HEAVY_OBJECTS:
                found.add(HEAVY_OBJECTS[id(bound)])
            elif depth > 0 and _own(bound):
                found |= function_reasons(bound, depth - 1)
    return frozenset(found)


_GLOBALS: dict[int, dict[str, Any]] = {}


def function_reasons(func: Any, depth: int = DEPTH) -> frozenset[str]:
    """Why calling ``func`` is heavy, read from its code: the reasons of
    :data:`HEAVY_NAMES` and :data:`HEAVY_OBJECTS` it names, and those of the
    functions of the test code it calls by a module-level name (``depth`` deep).

    Args:
        func: a function (a test, a fixture's function, a helper).
        depth (int): how many calls deep to follow helpers. Default: :data:`DEPTH`.

    Returns:
        frozenset[str]: a subset of :data:`HEAVY` (empty: nothing heavy found).
    """
    func = getattr(func, "__wrapped__", func)
    code = getattr(func, "__code__", None)
    if code is None:
        return frozenset()
    namespace = getattr(func, "__globals__", {})
    _GLOBALS[id(namespace)] = namespace
    return _reasons_of_code(code, id(namespace), depth)


def heavy_reasons(item: pytest.Item) -> set[str]:
    """Why ``item`` is not ``fast``: its folder, its hand-written markers, and
    what its test function and the fixtures it uses (all of them, through
    ``item.fixturenames``) name (:func:`function_reasons`).

    Args:
        item (pytest.Item): a collected test.

    Returns:
        set[str]: a subset of :data:`HEAVY` (empty: the test is ``fast``).
    """
    reasons = {m.name for m in item.iter_markers() if m.name in HEAVY}
    for folder, reason in HEAVY_DIRS.items():
        if folder in item.path.parents:
            reasons.add(reason)
    func = getattr(item, "function", None)
    if func is not None:
        reasons |= function_reasons(func)
    info = getattr(item, "_fixtureinfo", None)
    for name in getattr(item, "fixturenames", ()):
        if name in HEAVY_NAMES:
            reasons.add(HEAVY_NAMES[name])
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs:
            reasons |= function_reasons(defs[-1].func)
    return reasons


def classify(items: list[pytest.Item]) -> None:
    """Mark each item with its heavy reasons, or ``fast`` when it has none."""
    for item in items:
        reasons = heavy_reasons(item)
        present = {m.name for m in item.iter_markers()}
        for reason in sorted(reasons - present):
            item.add_marker(reason)
        if not reasons:
            item.add_marker("fast")


class SpawnGuard:
    """Fails a ``fast`` test during whose setup, call or teardown a process was
    started (audit events ``subprocess.Popen``, ``os.posix_spawn``, ``os.system``,
    ``os.exec``; Python's audit hooks, PEP 578): the reading of
    :func:`heavy_reasons` missed it, so ``-m fast`` would run a slow test.

    mlxspec's own helper children (:data:`OWN_CHILDREN`: the grammar compile
    sandbox, part of any engine that compiles a grammar) and the tool probes
    of :data:`PROBES` are not counted. The hook stays installed for the
    process's life (audit hooks cannot be removed) and records only while a
    ``fast`` test runs.
    """

    EVENTS = frozenset({"subprocess.Popen", "os.posix_spawn", "os.system", "os.exec"})
    #: Scripts of mlxspec that the engine runs as children of its own.
    OWN_CHILDREN = frozenset({str(ROOT / "mlxspec" / "engine" / "sampling" / "grammar_sandbox.py")})
    #: Programs libraries run to look something up (ctypes.util.find_library, platform).
    PROBES = frozenset({"ldconfig", "uname", "gcc", "cc", "ld", "objdump", "lscpu"})

    def __init__(self) -> None:
        self.watching = False
        self.started: list[str] = []
        sys.addaudithook(self._hook)

    def _counts(self, event: str, args: tuple[Any, ...]) -> bool:
        if event not in self.EVENTS:
            return False
        argv = args[1] if len(args) > 1 and isinstance(args[1], (list, tuple)) else []
        words = [str(a) for a in argv]
        if any(w in self.OWN_CHILDREN for w in words):
            return False
        return not (words and Path(words[0]).name in self.PROBES)

    def _hook(self, event: str, args: tuple[Any, ...]) -> None:
        if self.watching and self._counts(event, args):
            self.started.append(f"{event}: {args[:2]!r}"[:300])

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Any:
        self.started.clear()
        self.watching = item.get_closest_marker("fast") is not None
        try:
            return (yield)
        finally:
            self.watching = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
        report = yield
        if self.watching and self.started and report.passed:
            report.outcome = "failed"
            report.longrepr = (
                f"{item.nodeid} is in the fast tier but started a process:\n  "
                + "\n  ".join(self.started)
                + "\nname what starts it in tests/tiers.py's HEAVY_NAMES, or mark "
                "the test @pytest.mark.subprocess (docs/testing.md)"
            )
            self.started.clear()
        return report


#: Cache subfolders shared by every worker: content-addressed, published atomically
#: (a conversion two workers race to make is made twice and one rename wins).
SHARED_CACHE = ("gguf", "whisper", "embedded", "downloads")


def own_cache_dir(worker: str) -> Path:
    """Point ``MLXSPEC_CACHE_DIR`` at a cache folder of this test process alone.

    Under pytest-xdist each worker (``gw0``, ``gw1``, ...) gets its own, so the
    web chat's default ``chat.sqlite3``, the adapters folder and anything else a
    test writes there never meet another worker's (or the user's); the GGUF and
    Whisper conversions and the embedded model's wheel (:data:`SHARED_CACHE`)
    stay shared with the user's cache through symlinks, so nothing is converted
    twice. Every ``mlxspec serve`` a test starts inherits the variable.

    Args:
        worker (str): the xdist worker id, ``"main"`` without xdist.

    Returns:
        Path: the new folder (removed by :func:`configure`'s cleanup).
    """
    configured = os.environ.get("MLXSPEC_CACHE_DIR")
    shared = Path(configured).expanduser() if configured else Path.home() / ".cache" / "mlxspec"
    own = Path(tempfile.mkdtemp(prefix=f"mlxspec-tests-{worker}-"))
    for name in SHARED_CACHE:
        (shared / name).mkdir(parents=True, exist_ok=True)
        (own / name).symlink_to(shared / name, target_is_directory=True)
    os.environ["MLXSPEC_CACHE_DIR"] = str(own)
    return own


def configure(config: pytest.Config) -> None:
    """Register the tier markers and the :class:`SpawnGuard`; give this process
    (an xdist worker or a plain run) its own cache folder (:func:`own_cache_dir`)."""
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.pluginmanager.register(SpawnGuard(), "mlxspec-spawn-guard")
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    own = own_cache_dir(worker)
    config.add_cleanup(lambda: shutil.rmtree(own, ignore_errors=True))

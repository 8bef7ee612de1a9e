"""Two replicas behind HAProxy on loopback, configured as ``docs/replicas.md`` says
(issue 33, item 4): one session's requests stay on one replica
(``x-session-affinity``), and move to the other when that one dies (``/health``
probes, redispatch). Needs ``haproxy`` (Debian's package); skipped without it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from mlxspec.conformance.live import free_port, wait_healthy

pytestmark = [
    pytest.mark.subprocess,
    # .ci/run installs it and sets MLXSPEC_REQUIRE_HAPROXY=1: there a missing one fails
    pytest.mark.skipif(
        shutil.which("haproxy") is None and os.environ.get("MLXSPEC_REQUIRE_HAPROXY") != "1",
        reason="haproxy is not installed",
    ),
]

DOC = Path(__file__).resolve().parents[2] / "docs" / "replicas.md"


def haproxy_config(front: int, ports: list[int], stats: int) -> str:
    """The document's HAProxy block, on this test's ports (so the test runs what it shows)."""
    text = DOC.read_text()
    config = re.search(r"```haproxy\n(.*?)```", text, re.S)
    assert config is not None
    body = config.group(1).replace("127.0.0.1:8000", f"127.0.0.1:{front}")
    for name, port in zip(("8081", "8082"), ports, strict=True):
        body = body.replace(f"127.0.0.1:{name}", f"127.0.0.1:{port}")
    body = body.replace("inter 2s", "inter 500ms")  # notice the dead replica sooner
    # a stats page (the test's own, not the document's) to see when HAProxy has both replicas up
    stats_page = (
        f"frontend stats\n    bind 127.0.0.1:{stats}\n    stats enable\n    stats uri /stats\n"
    )
    return body + "\n" + stats_page


def wait_both_up(stats: int, timeout: float) -> None:
    """Until HAProxy's probes have marked both servers UP: before that, the hash of a session
    maps over the servers up so far, and moves when the other comes up."""
    deadline = time.monotonic() + timeout
    while True:
        rows = httpx.get(f"http://127.0.0.1:{stats}/stats;csv", timeout=5).text.splitlines()
        status = {r.split(",")[1]: r.split(",")[17] for r in rows if r.startswith("replicas,r")}
        if status == {"r1": "UP", "r2": "UP"}:
            return
        assert time.monotonic() < deadline, status
        time.sleep(0.2)


@pytest.fixture()
def replicas(tiny_model_dir: Path, tmp_path: Path) -> Iterator[tuple[str, list, list[str]]]:
    """Two ``mlxspec serve`` replicas and HAProxy in front: (front URL, processes, bases)."""
    ports, front, stats = [free_port(), free_port()], free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(DOC.parents[1]), "HF_HUB_OFFLINE": "1"}
    with ExitStack() as stack:
        procs = []
        for i, port in enumerate(ports):
            log = stack.enter_context(open(tmp_path / f"r{i}.log", "w"))
            argv = [sys.executable, "-m", "mlxspec", "serve", str(tiny_model_dir)]
            procs.append(
                subprocess.Popen(
                    [*argv, "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env
                )
            )
        config = tmp_path / "haproxy.cfg"
        config.write_text(haproxy_config(front, ports, stats))
        hap = subprocess.Popen(["haproxy", "-f", str(config)], stdout=subprocess.DEVNULL)
        procs.append(hap)
        try:
            bases = [f"http://127.0.0.1:{p}" for p in ports]
            for base, proc in zip(bases, procs, strict=False):
                wait_healthy(base, 300, proc)
            wait_healthy(f"http://127.0.0.1:{front}", 30, hap)
            wait_both_up(stats, 30)
            yield f"http://127.0.0.1:{front}", procs, bases
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()


def ask(front: str, session: str) -> httpx.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    headers = {"x-session-affinity": session}
    return httpx.post(f"{front}/v1/chat/completions", json=body, headers=headers, timeout=60)


def submitted(base: str) -> int:
    return httpx.get(f"{base}/stats", timeout=30).json()["requests"]["submitted"]


def test_a_session_sticks_to_one_replica_and_fails_over(replicas) -> None:
    front, procs, bases = replicas
    for _ in range(4):
        assert ask(front, "alice").status_code == 200
    counts = [submitted(b) for b in bases]
    assert sorted(counts) == [0, 4]  # all four on one replica
    home = counts.index(4)
    procs[home].kill()
    procs[home].wait()
    deadline = time.monotonic() + 30
    while True:  # until HAProxy's probes take the dead one out (or a retry redispatches)
        reply = ask(front, "alice")
        if reply.status_code == 200:
            break
        assert time.monotonic() < deadline, reply.text
        time.sleep(0.5)
    assert submitted(bases[1 - home]) >= 1

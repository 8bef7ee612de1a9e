"""Per-request HTTP overhead of small streamed chats on a tiny model.

Starts ``mlxspec serve`` on the tiny random-weight test model (built like the
tests' fixture, :func:`fixtures.tiny_model.build_tiny_llama`), once per build
(a source tree: ``--builds before=/work/main after=.`` puts each tree first on
the server's ``PYTHONPATH``), all servers at once on their own ports, and sends
each, round after round in turn, ``--requests`` small streamed
``/v1/chat/completions`` requests one after another (``sequential``) and then
all at once (``concurrent``). Every request decodes exactly ``--max-tokens``
tokens of one ASCII letter (a ``logit_bias`` of +100 on it), so each token
shows up as content at once and EOS never comes.

Per request, from the client: ``wall`` (send to the end of the stream) and
``ttft`` (send to the first content delta; ``concurrent`` times both from the
burst's start). From the server, per phase: ``server_ttft`` (the mean of the
``mlxspec_time_to_first_token_seconds`` histogram over the phase: from
``Engine.submit`` to the handler receiving the first token, i.e. the engine
plus the hand-off to the event loop), so ``ttft - server_ttft`` is the HTTP
side (reading, routing and validating the request, templating it, writing
the frames); and ``loop_cpu`` (CPU time of the server's main thread, the event
loop, per request, from ``/proc/<pid>/task/<pid>/schedstat``), which holds
the GIL the engine thread needs. Medians over all rounds.

Those times move with the machine's load; ``python_calls`` does not: for each
build, in a subprocess, the ASGI app of ``create_app`` on a scripted engine
(``tests.fakes.FakeEngine``, ``fixtures.tool_models.ScriptedEngine`` in
older trees: a real chat template, no model, no engine thread) serves the same
streamed request (``--max-tokens`` one-letter chunks) in process under
``cProfile``, which counts the Python function calls
per request: the work the event loop does for one request, less the engine.
Writes ``benchmarks/results/<name>.json``. Run by hand, never in CI:

    python benchmarks/http_overhead.py --builds before=/work/main after=. --name cpu-http-overhead
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from mlxspec.conformance.asgi import chat_post_scope, one_body_receive

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

PHASES = ("sequential", "concurrent")


def loop_cpu_s(pid: int) -> float:
    """CPU seconds of process ``pid``'s main thread (its event loop)."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def ttft_histogram(base: str) -> tuple[float, float]:
    """(sum of seconds, count) of the server's time-to-first-token histogram."""
    text = httpx.get(base + "/metrics", timeout=30).text
    found = {}
    for line in text.splitlines():
        for key in ("sum", "count"):
            if line.startswith(f"mlxspec_time_to_first_token_seconds_{key} "):
                found[key] = float(line.split()[1])
    return found["sum"], found["count"]


def chat_body(letter_id: int, max_tokens: int) -> dict:
    """A greedy streamed chat that emits ``max_tokens`` copies of one letter."""
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": "Say something short."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "logit_bias": {str(letter_id): 100},
    }


async def one(client: httpx.AsyncClient, base: str, body: dict, t0: float | None) -> dict:
    """One streamed request; client wall and TTFT in ms (from ``t0`` if given)."""
    start = time.perf_counter() if t0 is None else t0
    ttft = None
    async with client.stream("POST", base + "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if ttft is None and '"content":"' in line and '"content":""' not in line:
                ttft = time.perf_counter() - start
    return {"wall": (time.perf_counter() - start) * 1e3, "ttft": (ttft or 0.0) * 1e3}


async def phase(base: str, pid: int, body: dict, n: int, concurrent: bool) -> dict:
    """``n`` requests one after another or all at once; per-request client
    times and the phase's server-side TTFT mean and loop CPU per request."""
    limits = httpx.Limits(max_connections=2 * n)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        hist0, cpu0 = ttft_histogram(base), loop_cpu_s(pid)
        if concurrent:
            t0 = time.perf_counter()
            runs = await asyncio.gather(*(one(client, base, body, t0) for _ in range(n)))
        else:
            runs = [await one(client, base, body, None) for _ in range(n)]
        cpu = loop_cpu_s(pid) - cpu0
        hist1 = ttft_histogram(base)
    ttft_sum, count = hist1[0] - hist0[0], hist1[1] - hist0[1]
    return {
        "requests": runs,
        "server_ttft": ttft_sum / count * 1e3 if count else None,
        "loop_cpu": cpu / n * 1e3,
    }


def commit_of(tree: Path) -> str:
    """The checked-out commit of ``tree`` (``+dirty`` with uncommitted changes)."""
    git = ["git", "-C", str(tree)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    if head.returncode != 0:
        return "no git checkout"
    return head.stdout.strip() + ("+dirty" if dirty else "")


def letter_token(model_dir: Path) -> int:
    """The tokenizer's id of ``a`` (one byte token)."""
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode("a").ids
    assert len(ids) == 1, ids
    return ids[0]


@contextlib.contextmanager
def servers(builds: dict[str, Path], model_dir: Path, logs: Path):
    """Start one ``mlxspec serve`` per build; yield ``{label: (base, pid)}``."""
    from mlxspec.conformance.live import free_port, wait_healthy

    procs = {}
    try:
        for label, tree in builds.items():
            port = free_port()
            env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(tree)}
            argv = [sys.executable, "-m", "mlxspec", "serve", str(model_dir), "--port", str(port)]
            with open(logs / f"{label}.log", "w") as log:
                proc = subprocess.Popen(argv, env=env, cwd=tree, stdout=log, stderr=log)
            procs[label] = (f"http://127.0.0.1:{port}", proc)
        for base, proc in procs.values():
            wait_healthy(base, 300, proc)
        yield {label: (base, proc.pid) for label, (base, proc) in procs.items()}
    finally:
        for _, proc in procs.values():
            proc.terminate()
            proc.wait(30)


async def _asgi_request(app: Any, body: bytes) -> bytes:
    """One ``POST /v1/chat/completions`` through an ASGI app; the response body."""
    scope = chat_post_scope(len(body))
    receive, done = one_body_receive(body)
    out = []

    async def send(message: dict) -> None:
        out.append(message.get("body", b""))

    await app(scope, receive, send)
    done.set()
    return b"".join(out)


def count_calls(tree: str, model_dir: str, chunks: int, n: int = 50) -> int:
    """Python function calls per streamed chat request through ``tree``'s app
    on a scripted engine (run in a subprocess whose path starts at ``tree``)."""
    import cProfile
    import pstats

    import uvloop

    sys.path.insert(0, tree)
    from mlxspec.http.app import create_app

    assert Path(sys.modules["mlxspec"].__file__).is_relative_to(tree)
    try:
        from tests.fakes import FakeEngine

        engine = FakeEngine.from_dir(Path(model_dir))
    except ImportError:  # a tree from before the shared fake
        from fixtures.tool_models import ScriptedEngine

        engine = ScriptedEngine(Path(model_dir))
    engine.script = ["a"] * chunks
    app = create_app(engine)
    body = json.dumps({**chat_body(0, chunks), "logit_bias": {}}).encode()

    async def many() -> None:
        for _ in range(n):
            assert (await _asgi_request(app, body)).endswith(b"data: [DONE]\n\n")
            engine.requests.clear()
            engine.prompts.clear()

    uvloop.run(many())  # warm-up: first-use imports and caches
    profile = cProfile.Profile()
    profile.enable()
    uvloop.run(many())
    profile.disable()
    return pstats.Stats(profile).total_calls // n


def python_calls(builds: dict[str, Path], model_dir: Path, chunks: int) -> dict[str, int]:
    """:func:`count_calls` for each build, each in its own interpreter."""
    out = {}
    for label, tree in builds.items():
        argv = [sys.executable, __file__, "--count-calls", str(tree), str(model_dir), str(chunks)]
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
        out[label] = int(done.stdout.split()[-1])
    return out


def summary(rounds: list[dict]) -> dict:
    """Medians (and p90 of client times) over every request of every round."""
    runs = [r for rnd in rounds for r in rnd["requests"]]
    out = {}
    for key in ("wall", "ttft"):
        values = sorted(r[key] for r in runs)
        out[f"{key}_ms_p50"] = round(statistics.median(values), 2)
        out[f"{key}_ms_p90"] = round(values[int(0.9 * (len(values) - 1))], 2)
    server = [r["server_ttft"] for r in rounds if r["server_ttft"] is not None]
    out["server_ttft_ms_p50"] = round(statistics.median(server), 2) if server else None
    out["loop_cpu_ms_per_request_p50"] = round(statistics.median(r["loop_cpu"] for r in rounds), 2)
    return out


async def measure(live: dict, body: dict, args: argparse.Namespace) -> dict:
    """Warm up each server, then ``args.rounds`` rounds of both phases, the
    builds taking turns within each round."""
    for base, pid in live.values():
        for concurrent in (False, True):
            await phase(base, pid, body, args.requests, concurrent)
    results: dict = {label: {p: [] for p in PHASES} for label in live}
    for rnd in range(args.rounds):
        order = list(live) if rnd % 2 == 0 else list(reversed(live))
        for label in order:
            base, pid = live[label]
            for name in PHASES:
                got = await phase(base, pid, body, args.requests, name == "concurrent")
                results[label][name].append(got)
                s = summary([got])
                print(f"round {rnd} {label:>8} {name:>10}: {s}", flush=True)
    return results


def main() -> None:
    if sys.argv[1:2] == ["--count-calls"]:  # the subprocess of python_calls
        print(count_calls(sys.argv[2], sys.argv[3], int(sys.argv[4])))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--builds", nargs="+", default=["current=" + str(HERE.parent)])
    parser.add_argument("--model", type=Path, help="model folder (default: a fresh tiny model)")
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--name", default="cpu-http-overhead")
    args = parser.parse_args()
    builds = {b.split("=", 1)[0]: Path(b.split("=", 1)[1]).resolve() for b in args.builds}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = args.model
        if model_dir is None:
            from fixtures.tiny_model import build_tiny_llama

            model_dir = build_tiny_llama(Path(tmp) / "tiny-llama")
        body = chat_body(letter_token(model_dir), args.max_tokens)
        calls = python_calls(builds, model_dir, args.max_tokens)
        print(f"python calls per request: {calls}", flush=True)
        with servers(builds, model_dir, Path(tmp)) as live:
            raw = asyncio.run(measure(live, body, args))
    report = {
        "name": args.name,
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "requests": args.requests,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "builds": {label: f"{tree} at {commit_of(tree)}" for label, tree in builds.items()},
        "python_calls_per_request": calls,
        "summary": {label: {p: summary(raw[label][p]) for p in PHASES} for label in raw},
        "raw": raw,
    }
    out = HERE / "results" / f"{args.name}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report["summary"], indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

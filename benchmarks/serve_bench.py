"""Serving benchmark: mlxspec against mlx_lm.server on the same model, side by side.

Starts each server in turn on 127.0.0.1 with the same model folder, sends the
same streamed greedy chat workload (fixed prompt lengths, fixed output length:
EOS is forbidden with ``logit_bias``) at several concurrency levels, and
reports per server and level: aggregate output tokens/s, TTFT p50/p95 and
inter-token latency p50/p95, plus a repeated multi-turn conversation's TTFT
(prompt-cache effect) and mlx-lm's own single-stream ``stream_generate`` speed,
measured in a child process, under ``mlxspec serve``'s MLX environment defaults,
before each repeat of the servers and after the last.
Writes ``benchmarks/results/<name>.json`` and a PNG plot; prints mlxspec/mlx_lm
ratios. Run by hand, never in CI:

    python benchmarks/serve_bench.py --name cpu-smollm2 --max-tokens 32

Requires ``httpx`` and, for the plot, ``matplotlib``; ``tqdm`` for progress.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from bench_report import merge_runs, pct, plot, summarise
from direct_baseline import direct_in_child

from mlxspec.conformance.live import free_port, wait_healthy

HERE = Path(__file__).resolve().parent
FILLER = (
    "The quick brown fox jumps over the lazy dog while the river runs past old stone "
    "bridges, and scholars argue about maps, clocks, bread, weather and distant stars. "
)


def build_prompt(tokenizer, n_tokens: int, salt: int) -> str:
    """A user message whose templated prompt is close to ``n_tokens`` tokens."""
    text = f"[{salt}] " + FILLER * (n_tokens // 20 + 2)
    ids = tokenizer.encode(text, add_special_tokens=False)[: max(8, n_tokens - 30)]
    return tokenizer.decode(ids) + "\nSummarise."


#: Server kinds that differ from another kind only in their environment.
#: ``mlx_lm-nocudnn``: mlx_lm.server with cuDNN attention off, as ``mlxspec serve``
#: runs by default (``mlxspec.config.SERVE_ENV_DEFAULTS``): the like-for-like
#: comparison beside the out-of-the-box one.
#: ``mlxspec-cudnn``: mlxspec serve with cuDNN attention back on (its default is off).
KIND_ENV = {
    "mlx_lm-nocudnn": ("mlx_lm", {"MLX_CUDA_USE_CUDNN_SDPA": "0"}),
    "mlxspec-cudnn": ("mlxspec", {"MLX_CUDA_USE_CUDNN_SDPA": "1"}),
}
#: Kinds measured only on the multi-turn conversation (their levels would add time,
#: not information): the prompt cache's baseline.
TURNS_ONLY = {"mlxspec-nocache"}


def server_command(kind: str, model: str, port: int, batch: int) -> list[str]:
    if kind.startswith("mlxspec+"):  # extra serve flags, comma-separated: mlxspec+--flag,value
        return [*server_command("mlxspec", model, port, batch), *kind[len("mlxspec+") :].split(",")]
    if kind in KIND_ENV:
        return server_command(KIND_ENV[kind][0], model, port, batch)
    if kind in ("mlxspec-nocache", "mlxspec-nocache-levels"):  # every prompt prefilled
        return [*server_command("mlxspec", model, port, batch), "--prompt-cache-bytes", "0"]
    if kind == "mlxspec-native":  # the checkpoint's own weights: no float32 CPU copy
        return [*server_command("mlxspec", model, port, batch), "--cpu-weights", "native"]
    if kind == "mlxspec":
        return [
            sys.executable,
            "-m",
            "mlxspec",
            "serve",
            model,
            "--port",
            str(port),
            "--batch",
            str(batch),
            "--log-level",
            "warning",
        ]
    return [
        sys.executable,
        "-m",
        "mlx_lm.server",
        "--model",
        model,
        "--port",
        str(port),
        "--log-level",
        "WARNING",
        "--decode-concurrency",
        str(max(batch, 32)),
    ]


def start_server(kind: str, model: str, batch: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **KIND_ENV.get(kind, ("", {}))[1]}
    out = open(log, "w")
    proc = subprocess.Popen(
        server_command(kind, model, port, batch), stdout=out, stderr=subprocess.STDOUT, env=env
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, 600, proc)
    except (RuntimeError, TimeoutError):
        proc.kill()
        raise RuntimeError(f"{kind} did not start: {log.read_text()[-2000:]}") from None
    return proc, base


class Rejected(Exception):
    """The server answered 429 (its queue was full)."""


async def read_chat_stream(
    client: httpx.AsyncClient, base: str, body: dict
) -> tuple[list[float], str, dict | None]:
    """POST ``body`` to ``/v1/chat/completions`` and read its SSE stream.

    Returns:
        (stamps, text, usage): ``time.perf_counter()`` at each content delta, the
        text, and the last ``usage`` seen (``None`` if none came).

    Raises:
        Rejected: a 429 (admission's "queue full": an answer, not a failure).
        httpx.HTTPStatusError: any other non-2xx status.
    """
    stamps, text, usage = [], "", None
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        if r.status_code == 429:
            raise Rejected(r.headers.get("retry-after"))
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    stamps.append(time.perf_counter())
                    text += piece
    return stamps, text, usage


async def stream_one(
    client: httpx.AsyncClient, base: str, messages: list, max_tokens: int, bias: dict
) -> dict:
    """One streamed chat request: TTFT, chunk gaps, completion tokens, text."""
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "logit_bias": bias,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    stamps, text, usage = await read_chat_stream(client, base, body)
    end = time.perf_counter()
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    tokens = (usage or {}).get("completion_tokens") or len(stamps)
    details = (usage or {}).get("prompt_tokens_details") or {}
    # decode speed as stream_generate's generation_tps counts it: the tokens after
    # the first over the time from the first token to the last
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    return {
        "ttft": (stamps[0] - t0) if stamps else end - t0,
        "decode_tps": (tokens - 1) / span if span > 0 else None,
        "gaps": gaps,
        "tokens": tokens,
        "seconds": end - t0,
        "text": text,
        "prompt_tokens": (usage or {}).get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens"),
    }


async def run_level(
    base: str, prompts: list[str], conc: int, rounds: int, max_tokens: int, bias: dict, bar
) -> dict:
    results, failures, rejected = [], [], []
    limits = httpx.Limits(max_connections=conc + 4)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker(w: int) -> None:
            for r in range(rounds):
                prompt = prompts[(w * rounds + r) % len(prompts)]
                msgs = [{"role": "user", "content": prompt}]
                try:
                    results.append(await stream_one(client, base, msgs, max_tokens, bias))
                except Rejected as exc:
                    rejected.append(exc.args[0])
                except (httpx.HTTPError, json.JSONDecodeError) as exc:
                    failures.append(type(exc).__name__ + ": " + str(exc)[:120])
                if bar:
                    bar.update(1)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(conc)))
        wall = time.perf_counter() - t0
    ttfts = [r["ttft"] for r in results]
    gaps = [g for r in results for g in r["gaps"]]
    return {
        "concurrency": conc,
        "requests": len(results),
        "rejected_429": len(rejected),
        "failed": len(failures),
        "failures": sorted(set(failures))[:5],
        "wall_s": wall,
        "output_tokens": sum(r["tokens"] for r in results),
        "tok_per_s": sum(r["tokens"] for r in results) / wall,
        "ttft_p50": pct(ttfts, 0.5) or 0.0,
        "ttft_p95": pct(ttfts, 0.95) or 0.0,
        "decode_tok_per_s_p50": pct([r["decode_tps"] for r in results if r["decode_tps"]], 0.5),
        "itl_p50": pct(gaps, 0.5),
        "itl_p95": pct(gaps, 0.95),
    }


FOLLOW_UPS = ["And in one word?", "Say it again, shorter.", "Why?", "Give an example."]


async def multi_turn(base: str, prompt: str, max_tokens: int, bias: dict, turns: int = 4) -> dict:
    """One conversation of ``turns`` turns: each turn's prompt is the previous
    turn's prompt and answer plus a short follow-up, so a prompt cache can serve
    all but the new tail. Then the last turn is sent again unchanged (a repeated
    conversation). Reports each turn's TTFT and cached prompt tokens, the median
    TTFT of turns 2.. over turn 1's, and the repeat's TTFT over the last turn's
    (``repeat_ratio``: the same prompt, served from the cache the second time)."""
    per_turn = []
    async with httpx.AsyncClient(timeout=600) as client:
        msgs = [{"role": "user", "content": prompt}]
        for t in range(turns):
            r = await stream_one(client, base, msgs, max_tokens, bias)
            per_turn.append({k: r[k] for k in ("ttft", "prompt_tokens", "cached_tokens", "tokens")})
            last = list(msgs)
            msgs += [
                {"role": "assistant", "content": r["text"]},
                {"role": "user", "content": FOLLOW_UPS[t % len(FOLLOW_UPS)]},
            ]
        again = await stream_one(client, base, last, max_tokens, bias)
    later = pct([t["ttft"] for t in per_turn[1:]], 0.5) or per_turn[0]["ttft"]
    return {
        "turns": per_turn,
        "turn1_ttft": per_turn[0]["ttft"],
        "later_ttft_p50": later,
        "ratio": later / per_turn[0]["ttft"],
        "repeat": {k: again[k] for k in ("ttft", "prompt_tokens", "cached_tokens")},
        "repeat_ratio": again["ttft"] / per_turn[-1]["ttft"],
    }


class Progress:
    """What a benchmark run has measured so far, written to
    ``results/<name>.partial.json`` after every baseline and every level, so a
    run cut off (the H200 tool's time limit) keeps what it measured, and
    ``--resume`` carries on from the last whole server run or baseline.

    Args:
        path (Path): the partial file.
        resumed (dict | None): a partial file read back (``--resume``).
    """

    def __init__(self, path: Path, resumed: dict | None = None) -> None:
        self.path = path
        #: Finished events in run order: ``{"direct": tok/s}`` or ``{"kind", "run"}``.
        self.done: list[dict] = list((resumed or {}).get("done", []))
        self._current: dict | None = None
        # the levels of the server run that was cut off: its rerun keeps them, so a
        # run longer than one call still finishes over several
        self._carried: dict | None = (resumed or {}).get("under_way")

    def carried(self, kind: str, prompt_tokens: int, concurrency: int) -> dict | None:
        """A level the resumed run's cut-off ``kind`` run measured already, if any."""
        if self._carried is None or self._carried["kind"] != kind:
            return None
        for level in self._carried["levels"]:
            if (level["prompt_tokens"], level["concurrency"]) == (prompt_tokens, concurrency):
                return level
        return None

    def replay(self, index: int) -> dict | None:
        """The ``index``-th finished event of a resumed run, if it got that far."""
        return self.done[index] if index < len(self.done) else None

    def level(self, kind: str, level: dict) -> None:
        """A level of the server run under way was measured."""
        if self._current is None or self._current["kind"] != kind:
            self._current = {"kind": kind, "levels": []}
        self._current["levels"].append(level)
        self._write()

    def finish(self, event: dict) -> None:
        """A baseline or a whole server run ended."""
        self.done.append(event)
        self._current = self._carried = None
        self._write()

    def _write(self) -> None:
        doc = {"done": self.done, "under_way": self._current}
        self.path.write_text(json.dumps(doc, indent=1))


def run_repeats(
    args: argparse.Namespace, tokenizer, bias: dict, bar, out_dir: Path, progress: Progress
) -> tuple[dict[str, list[dict]], list[float]]:
    """``args.repeats`` rounds of every server, in alternating order, each round
    preceded by a direct ``stream_generate`` baseline, and one more baseline
    after the last (none with ``--skip-direct``): the baseline drifts between
    machine starts, so each repeat's single-stream ratio uses the ones beside it.
    Events a resumed run (``progress``) finished already are taken from it.

    Returns:
        tuple[dict[str, list[dict]], list[float]]: each server's per-repeat
        results (``measure_server``) and the baselines' tokens/s, in run order.
    """
    prompt = build_prompt(tokenizer, args.prompt_tokens[0], 0)  # the c=1 level's first prompt
    direct: list[float] = []
    runs: dict[str, list[dict]] = {kind: [] for kind in args.servers}
    step = 0

    def baseline() -> None:
        nonlocal step
        if args.skip_direct:
            return
        old = progress.replay(step)
        step += 1
        if old is not None:
            direct.append(old["direct"])
            return
        direct.append(direct_in_child(args.model, prompt, args.max_tokens, bias))
        progress.finish({"direct": direct[-1]})
        (bar.write if bar else print)(f"mlx-lm stream_generate: {direct[-1]:.1f} tok/s")

    order = list(args.servers)
    for rep in range(args.repeats):  # alternate the order: no server always runs first
        baseline()
        for kind in order:
            if kind in TURNS_ONLY and rep:  # its one conversation is measured already
                continue
            old = progress.replay(step)
            step += 1
            if old is None:
                turns = rep == 0 and args.turns > 0
                old = {
                    "kind": kind,
                    "run": measure_server(
                        kind, args, tokenizer, bias, bar, out_dir, turns, progress
                    ),
                }
                progress.finish(old)
            runs[kind].append(old["run"])
        order.reverse()
    baseline()
    return runs, direct


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="MLX model folder (default: the embedded SmolLM2)")
    ap.add_argument("--name", default="bench", help="results file stem")
    ap.add_argument("--prompt-tokens", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests per client per level")
    ap.add_argument("--batch", type=int, default=16, help="mlxspec --batch")
    ap.add_argument("--servers", nargs="+", default=["mlx_lm", "mlxspec"])
    ap.add_argument(
        "--skip-direct", action="store_true", help="skip the mlx-lm stream_generate baseline"
    )
    ap.add_argument(
        "--turns", type=int, default=4, help="turns of the multi-turn conversation (0: none)"
    )
    ap.add_argument(
        "--cap",
        action="append",
        default=[],
        metavar="KIND=N",
        help="run server KIND only at concurrency levels up to N (mlx_lm.server resets "
        "connections from 32 clients on; its 64-client level would take minutes)",
    )
    ap.add_argument(
        "--resume",
        type=Path,
        help="a results/<name>.partial.json of an interrupted run with the same arguments: "
        "its finished baselines and server runs are kept, the rest is measured",
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the servers this many times in alternating order, with a direct "
        "stream_generate baseline before each repeat and after the last; each level "
        "reports its median run (single-stream figures swing with run order)",
    )
    ap.add_argument(
        "--warm-rounds",
        type=int,
        default=1,
        help="unmeasured rounds at each level's concurrency before it is measured, on "
        "prompts of their own (the first server process on a fresh H200 ran its first "
        "level 2-3x slower per step than later ones)",
    )
    args = ap.parse_args(argv)

    from mlx_lm.utils import load_tokenizer

    if args.model is None:
        from mlxspec.engine.model.loader import resolve_model

        args.model = str(resolve_model(None).path)
    tokenizer = load_tokenizer(Path(args.model))
    bias = {str(t): -1e9 for t in tokenizer.eos_token_ids}
    try:
        from tqdm import tqdm
    except ImportError:  # progress is optional
        tqdm = None

    out_dir = HERE / "results"
    out_dir.mkdir(exist_ok=True)
    report = {
        "name": args.name,
        "model": args.model,
        "max_tokens": args.max_tokens,
        "rounds": args.rounds,
        "repeats": args.repeats,
        "machine": platform.platform(),
        "python": platform.python_version(),
        "servers": {},
    }
    import mlx.core as mx
    import mlx_lm

    report["mlx"], report["mlx_lm"] = mx.__version__, mlx_lm.__version__
    report["device"] = str(mx.default_device())
    total = (
        args.repeats
        * len(set(args.servers) - TURNS_ONLY)
        * len(args.prompt_tokens)
        * sum(c * args.rounds for c in args.concurrency)
    )
    bar = tqdm(total=total, desc="requests") if tqdm else None
    resumed = json.loads(args.resume.read_text()) if args.resume else None
    progress = Progress(out_dir / f"{args.name}.partial.json", resumed)
    runs, direct = run_repeats(args, tokenizer, bias, bar, out_dir, progress)
    if direct:
        report["mlx_lm_stream_generate_tok_per_s"] = statistics.median(direct)
        report["mlx_lm_stream_generate_tok_per_s_runs"] = direct
    for kind, results in runs.items():
        report["servers"][kind] = merge_runs(results)
    if bar:
        bar.close()
    summarise(report)
    path = out_dir / f"{args.name}.json"
    path.write_text(json.dumps(report, indent=2))
    plot(report, out_dir / f"{args.name}.png")
    print(f"wrote {path}")
    return 0


#: ``GET /metrics`` histograms whose sums and counts :func:`engine_reading` keeps.
TIMED = {
    "ttft": "mlxspec_time_to_first_token_seconds",
    "queue": "mlxspec_request_queue_time_seconds",
    "prefill": "mlxspec_request_prefill_time_seconds",
}


def engine_reading(base: str) -> dict[str, float]:
    """mlxspec's cumulative engine figures now: batched and lone steps (count,
    seconds in the model, rows) from ``GET /stats``, and the sum and count of
    each :data:`TIMED` histogram from ``GET /metrics``."""
    batch = httpx.get(f"{base}/stats", timeout=30).json()["batch"]
    out: dict[str, float] = {}
    for lane in ("steps", "solo_steps"):
        t = batch[lane]
        out[f"{lane}"] = t["steps"]
        out[f"{lane}_model_s"] = t["steps"] * t["generate_ms_mean"] / 1000
        out[f"{lane}_rows"] = t["steps"] * t["mean_rows"]
    text = httpx.get(f"{base}/metrics", timeout=30).text
    for key, name in TIMED.items():
        for line in text.splitlines():
            for part in ("sum", "count"):
                if line.startswith(f"{name}_{part} "):
                    out[f"{key}_{part}"] = float(line.split()[1])
    return out


def engine_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float | None]:
    """What one level cost the engine: batched and lone steps run, their mean
    milliseconds in the model and mean rows, and the mean server-side TTFT, queue
    time and prefill time (seconds) of the level's requests."""
    d = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in after}
    out: dict[str, float | None] = {}
    for lane in ("steps", "solo_steps"):
        n = d[lane]
        out[lane] = n
        out[f"{lane}_model_ms_mean"] = 1000 * d[f"{lane}_model_s"] / n if n else None
        out[f"{lane}_rows_mean"] = d[f"{lane}_rows"] / n if n else None
    for key in TIMED:
        n = d.get(f"{key}_count", 0.0)
        out[f"{key}_mean_s"] = d[f"{key}_sum"] / n if n else None
    return out


def level_cap(caps: list[str], kind: str) -> int:
    """The highest concurrency ``--cap KIND=N`` lets ``kind`` run (no cap: any)."""
    for cap in caps:
        name, _, n = cap.partition("=")
        if name == kind:
            return int(n)
    return 1 << 30


def measure_server(
    kind: str,
    args: argparse.Namespace,
    tokenizer,
    bias: dict,
    bar,
    out_dir: Path,
    with_turns: bool,
    progress: Progress | None = None,
) -> dict:
    """Start server ``kind``, run every prompt size and concurrency level (and,
    with ``with_turns``, the multi-turn conversation), stop it; returns
    ``{"levels": [...], "multi_turn": {...} | None}``."""
    proc, base = start_server(kind, args.model, args.batch, out_dir / f"{args.name}-{kind}.log")
    try:
        levels = []
        for n in args.prompt_tokens if kind not in TURNS_ONLY else ():
            prompts = [build_prompt(tokenizer, n, s) for s in range(64)]
            asyncio.run(run_level(base, prompts[:1], 1, 1, 4, bias, None))  # warm-up
            for conc in args.concurrency:
                if conc > level_cap(args.cap, kind):
                    continue
                kept = progress.carried(kind, n, conc) if progress is not None else None
                if progress is not None and kept is not None:  # measured before a cut-off
                    levels.append(kept)
                    progress.level(kind, kept)
                    continue
                if args.warm_rounds > 0:  # unmeasured, on prompts the level never sends
                    warm = [build_prompt(tokenizer, n, 1000 + s) for s in range(conc)]
                    asyncio.run(
                        run_level(base, warm, conc, args.warm_rounds, args.max_tokens, bias, None)
                    )
                before = engine_reading(base) if kind.startswith("mlxspec") else None
                level = asyncio.run(
                    run_level(base, prompts, conc, args.rounds, args.max_tokens, bias, bar)
                )
                if before is not None:
                    level["engine"] = engine_delta(before, engine_reading(base))
                levels.append({"prompt_tokens": n, **level})
                if progress is not None:
                    progress.level(kind, levels[-1])
        turns = None
        if with_turns:
            prompt = build_prompt(tokenizer, args.prompt_tokens[-1], 999)
            turns = asyncio.run(multi_turn(base, prompt, args.max_tokens, bias, args.turns))
        steps = solo = fit = None
        if kind.startswith("mlxspec"):  # the engine's own per-step times, and its /fit
            batch = httpx.get(f"{base}/stats", timeout=30).json()["batch"]
            steps, solo = batch["steps"], batch["solo_steps"]
            fit = httpx.get(f"{base}/fit", timeout=60).json()
        return {
            "levels": levels,
            "multi_turn": turns,
            "engine_steps": steps,
            "engine_solo_steps": solo,
            "fit": fit,
        }
    finally:
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    sys.exit(main())

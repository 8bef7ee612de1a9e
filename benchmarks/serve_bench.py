"""Serving benchmark: mlxspec against mlx_lm.server on the same model, side by side.

Starts each server in turn on 127.0.0.1 with the same model folder, sends the
same streamed greedy chat workload (fixed prompt lengths, fixed output length:
EOS is forbidden with ``logit_bias``) at several concurrency levels, and
reports per server and level: aggregate output tokens/s, TTFT p50/p95 and
inter-token latency p50/p95, plus a repeated multi-turn conversation's TTFT
(prompt-cache effect) and mlx-lm's own single-stream ``stream_generate`` speed.
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
import subprocess
import sys
import time
from pathlib import Path

import httpx

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


def server_command(kind: str, model: str, port: int, batch: int) -> list[str]:
    if kind == "mlxspec-nocache":  # the prompt cache's baseline: every prompt prefilled
        return [*server_command("mlxspec", model, port, batch), "--prompt-cache-bytes", "0"]
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
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
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
    stamps, text, usage = [], "", None
    async with client.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
        if r.status_code == 429:  # admission said "queue full": an answer, not a failure
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
    end = time.perf_counter()
    gaps = [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
    tokens = (usage or {}).get("completion_tokens") or len(stamps)
    details = (usage or {}).get("prompt_tokens_details") or {}
    return {
        "ttft": (stamps[0] - t0) if stamps else end - t0,
        "gaps": gaps,
        "tokens": tokens,
        "seconds": end - t0,
        "text": text,
        "prompt_tokens": (usage or {}).get("prompt_tokens"),
        "cached_tokens": details.get("cached_tokens"),
    }


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


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


def mlx_lm_direct(model: str, tokenizer, prompt: str, max_tokens: int) -> float:
    """mlx-lm's own single-stream decode speed (tokens/s), the server-overhead baseline."""
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    m, tok = load(model)
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True)
    procs = make_logits_processors({t: -1e9 for t in tok.eos_token_ids})
    last = None
    for _ in range(2):  # warm-up, then measure
        for last in stream_generate(  # noqa: B007 (the loop keeps the final response)
            m, tok, ids, max_tokens=max_tokens, logits_processors=procs
        ):
            pass
    return last.generation_tps


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
    ap.add_argument("--turns", type=int, default=4, help="turns of the multi-turn conversation")
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="run the servers this many times in alternating order; each level reports "
        "its median run (single-stream figures swing with run order)",
    )
    args = ap.parse_args(argv)

    from mlx_lm.utils import load_tokenizer

    if args.model is None:
        from mlxspec.engine.loader import resolve_model

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
    base_prompt = build_prompt(tokenizer, args.prompt_tokens[0], 0)
    if not args.skip_direct:
        report["mlx_lm_stream_generate_tok_per_s"] = mlx_lm_direct(
            args.model, tokenizer, base_prompt, args.max_tokens
        )
        print(f"mlx-lm stream_generate: {report['mlx_lm_stream_generate_tok_per_s']:.1f} tok/s")

    total = (
        args.repeats
        * len(args.servers)
        * len(args.prompt_tokens)
        * sum(c * args.rounds for c in args.concurrency)
    )
    bar = tqdm(total=total, desc="requests") if tqdm else None
    runs: dict[str, list[dict]] = {kind: [] for kind in args.servers}
    order = list(args.servers)
    for rep in range(args.repeats):  # alternate the order: no server always runs first
        for kind in order:
            runs[kind].append(
                measure_server(kind, args, tokenizer, bias, bar, out_dir, with_turns=rep == 0)
            )
        order.reverse()
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


def measure_server(
    kind: str, args: argparse.Namespace, tokenizer, bias: dict, bar, out_dir: Path, with_turns: bool
) -> dict:
    """Start server ``kind``, run every prompt size and concurrency level (and,
    with ``with_turns``, the multi-turn conversation), stop it; returns
    ``{"levels": [...], "multi_turn": {...} | None}``."""
    proc, base = start_server(kind, args.model, args.batch, out_dir / f"{args.name}-{kind}.log")
    try:
        levels = []
        for n in args.prompt_tokens:
            prompts = [build_prompt(tokenizer, n, s) for s in range(64)]
            asyncio.run(run_level(base, prompts[:1], 1, 1, 4, bias, None))  # warm-up
            for conc in args.concurrency:
                level = asyncio.run(
                    run_level(base, prompts, conc, args.rounds, args.max_tokens, bias, bar)
                )
                levels.append({"prompt_tokens": n, **level})
        turns = None
        if with_turns:
            prompt = build_prompt(tokenizer, args.prompt_tokens[-1], 999)
            turns = asyncio.run(multi_turn(base, prompt, args.max_tokens, bias, args.turns))
        return {"levels": levels, "multi_turn": turns}
    finally:
        proc.terminate()
        proc.wait(30)


def merge_runs(runs: list[dict]) -> dict:
    """One server's repeated runs -> one result: each level is its median run by
    aggregate tokens/s (the lower middle one for an even count), with every
    run's tokens/s kept in ``tok_per_s_runs``; the multi-turn result is the first run's."""
    levels = []
    for i, first in enumerate(runs[0]["levels"]):
        same = sorted((r["levels"][i] for r in runs), key=lambda lv: lv["tok_per_s"])
        mid = dict(same[(len(same) - 1) // 2])
        mid["tok_per_s_runs"] = [r["levels"][i]["tok_per_s"] for r in runs]
        assert mid["concurrency"] == first["concurrency"]
        levels.append(mid)
    return {"levels": levels, "multi_turn": runs[0]["multi_turn"]}


def summarise(report: dict) -> None:
    servers = report["servers"]
    if {"mlx_lm", "mlxspec"} <= servers.keys():
        ratios = []
        for a, b in zip(servers["mlxspec"]["levels"], servers["mlx_lm"]["levels"], strict=True):
            ratios.append(
                {
                    "prompt_tokens": a["prompt_tokens"],
                    "concurrency": a["concurrency"],
                    "tok_per_s_ratio": a["tok_per_s"] / max(b["tok_per_s"], 1e-9),
                    "ttft_p50_ratio": a["ttft_p50"] / max(b["ttft_p50"], 1e-9),
                }
            )
        report["ratios_mlxspec_over_mlx_lm"] = ratios
    if "mlxspec" in servers:
        single = [lv for lv in servers["mlxspec"]["levels"] if lv["concurrency"] == 1]
        if single and "mlx_lm_stream_generate_tok_per_s" in report:
            report["mlxspec_single_stream_over_stream_generate"] = (
                single[0]["tok_per_s"] / report["mlx_lm_stream_generate_tok_per_s"]
            )
    print(
        f"{'server':8} {'prompt':>6} {'conc':>4} {'tok/s':>8} {'TTFT p50':>9} {'p95':>7} "
        f"{'ITL p50':>8} {'p95':>7}"
    )
    for kind, data in servers.items():
        for lv in data["levels"]:
            print(
                f"{kind:8} {lv['prompt_tokens']:6} {lv['concurrency']:4} {lv['tok_per_s']:8.1f} "
                f"{lv['ttft_p50']:9.3f} {lv['ttft_p95']:7.3f} {lv['itl_p50'] or 0:8.4f} "
                f"{lv['itl_p95'] or 0:7.4f} failed={lv['failed']} 429={lv.get('rejected_429', 0)}"
            )
        mt = data["multi_turn"]
        cached = [t["cached_tokens"] for t in mt["turns"]]
        print(
            f"{kind:8} multi-turn TTFT later/turn1 = {mt['ratio']:.2f} "
            f"(turn1 {mt['turn1_ttft']:.3f}s, later p50 {mt['later_ttft_p50']:.3f}s, "
            f"cached tokens per turn {cached}); repeat of the last turn: TTFT "
            f"x{mt['repeat_ratio']:.2f} ({mt['repeat']['cached_tokens']} cached)"
        )
    if {"mlxspec", "mlxspec-nocache"} <= servers.keys():
        cached = servers["mlxspec"]["multi_turn"]["turns"]
        fresh = servers["mlxspec-nocache"]["multi_turn"]["turns"]
        per_turn = [a["ttft"] / max(b["ttft"], 1e-9) for a, b in zip(cached, fresh, strict=True)]
        report["prompt_cache_ttft_ratio"] = {
            "per_turn": per_turn,
            "later_turns_p50": pct(per_turn[1:], 0.5),
        }
        print(
            "prompt cache: TTFT with / without the cache per turn "
            + ", ".join(f"{r:.2f}" for r in per_turn)
            + f" (later turns p50 {report['prompt_cache_ttft_ratio']['later_turns_p50']:.2f})"
        )
    for r in report.get("ratios_mlxspec_over_mlx_lm", []):
        print(
            f"ratio prompt {r['prompt_tokens']:5} conc {r['concurrency']:3}: "
            f"tok/s x{r['tok_per_s_ratio']:.2f}, TTFT p50 x{r['ttft_p50_ratio']:.2f}"
        )


def plot(report: dict, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot")
        return
    prompt_sizes = sorted(
        {lv["prompt_tokens"] for d in report["servers"].values() for lv in d["levels"]}
    )
    fig, axes = plt.subplots(
        1, len(prompt_sizes), figsize=(6 * len(prompt_sizes), 4), squeeze=False
    )
    for ax, n in zip(axes[0], prompt_sizes, strict=True):
        for kind, data in report["servers"].items():
            lv = [x for x in data["levels"] if x["prompt_tokens"] == n]
            ax.plot(
                [x["concurrency"] for x in lv], [x["tok_per_s"] for x in lv], marker="o", label=kind
            )
        ax.set_title(f"{report['name']}: prompt {n} tokens, {report['max_tokens']} out")
        ax.set_xlabel("concurrent streaming clients")
        ax.set_ylabel("aggregate output tokens/s")
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())

"""Images in: mlxspec against ``mlx_vlm.server`` on the same tiny random VLM.

Both servers run at once on one model folder (``fixtures/tiny_vlm.py``'s
Qwen2.5-VL unless ``--model``); each request is a streamed greedy chat turn
with one image (a fresh random PNG per request, so no server reuses a tower
output) and a fixed output length (``--max-tokens``, EOS forbidden with
``logit_bias``). At each concurrency level the servers take turns, the order
alternating every repeat, so a change in the machine's load falls on both.
Reported per server and level: aggregate output tokens/s and TTFT p50, with
medians over the repeats and the mlxspec/mlx_vlm ratios; then the follow-up
turn: a first turn about a new image, then a second turn about the same image
(the first answer in between), TTFT of each and their ratio. The load average
is recorded before and after. Writes ``benchmarks/results/<name>.json`` and an
SVG plot beside it (no plotting library). Run by hand, never in CI:

    python benchmarks/vision_bench.py --name vision-cpu
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np
from serve_bench import read_chat_stream

from mlxspec.conformance.live import free_port, wait_healthy

HERE = Path(__file__).resolve().parent
PROMPT = "Describe this image in detail."


def image_url(seed: int, size: tuple[int, int] = (100, 80)) -> str:
    """A random-noise PNG as a ``data:`` URL (``seed`` makes each request's own)."""
    from PIL import Image

    pixels = (np.random.RandomState(seed).rand(size[1], size[0], 3) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


def turn(url: str, text: str = PROMPT) -> dict:
    """A user message with one image and a question."""
    return {
        "role": "user",
        "content": [
            {"type": "image_url", "image_url": {"url": url}},
            {"type": "text", "text": text},
        ],
    }


async def stream_one(
    client: httpx.AsyncClient, base: str, messages: list, tokens: int, bias: dict, model: str
) -> dict:
    """One streamed greedy chat request (``model`` named: mlx_vlm.server asks for it):
    TTFT, completion tokens (from ``usage``, else the content chunks), text."""
    body = {
        "model": model,
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "logit_bias": bias,
        "stream_options": {"include_usage": True},
    }
    t0 = time.perf_counter()
    stamps, text, usage = await read_chat_stream(client, base, body)
    end = time.perf_counter()
    details = (usage or {}).get("prompt_tokens_details") or {}
    return {
        "ttft": (stamps[0] - t0) if stamps else end - t0,
        "tokens": (usage or {}).get("completion_tokens") or len(stamps),
        "seconds": end - t0,
        "text": text,
        "cached_tokens": details.get("cached_tokens"),
    }


def start(kind: str, model: str, batch: int, log: Path) -> tuple[subprocess.Popen, str]:
    """Start ``mlxspec serve`` or ``mlx_vlm.server`` on ``model``; wait for /health."""
    port = free_port()
    if kind == "mlxspec":
        argv = ["-m", "mlxspec", "serve", model, "--port", str(port), "--batch", str(batch)]
        argv += ["--log-level", "warning", "--whisper-model", "none"]
    else:
        argv = ["-m", "mlx_vlm.server", "--model", model, "--host", "127.0.0.1"]
        argv += ["--port", str(port)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, *argv], stdout=open(log, "w"), stderr=subprocess.STDOUT, env=env
    )
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, 600, proc)
    return proc, base


async def level(
    base: str, model: str, c: int, rounds: int, tokens: int, bias: dict, salt: int
) -> dict:
    """``c`` workers, ``rounds`` requests each, one new image per request."""
    limits = httpx.Limits(max_connections=c + 2)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker(w: int) -> list[dict]:
            out = []
            for r in range(rounds):
                messages = [turn(image_url(salt + w * 1000 + r))]
                out.append(await stream_one(client, base, messages, tokens, bias, model))
            return out

        t0 = time.perf_counter()
        results = [
            x for batch in await asyncio.gather(*(worker(w) for w in range(c))) for x in batch
        ]
        wall = time.perf_counter() - t0
    produced = sum(r["tokens"] for r in results)
    return {
        "tokens": produced,
        "wall_s": wall,
        "tok_s": produced / wall,
        "ttft_p50": statistics.median(r["ttft"] for r in results),
    }


async def follow_up(base: str, model: str, tokens: int, bias: dict, seed: int) -> dict:
    """TTFT of a first turn about a new image and of a second turn about it."""
    async with httpx.AsyncClient(timeout=600) as client:
        first = [turn(image_url(seed))]
        one = await stream_one(client, base, first, tokens, bias, model)
        second = [*first, {"role": "assistant", "content": one["text"]}]
        second.append({"role": "user", "content": "And what colours stand out?"})
        try:
            two = await stream_one(client, base, second, tokens, bias, model)
        except httpx.HTTPStatusError as e:  # mlx_vlm.server 0.7.10 fails this turn (a 500)
            return {"first_ttft": one["ttft"], "error": str(e.response.status_code)}
    return {
        "first_ttft": one["ttft"],
        "second_ttft": two["ttft"],
        "ratio": two["ttft"] / one["ttft"],
        "second_cached_tokens": two["cached_tokens"],
    }


def _tag(name: str, text: str = "", **attrs: object) -> str:
    """One SVG element (attribute names with ``_`` for ``-``)."""
    written = " ".join(f'{k.replace("_", "-")}="{v}"' for k, v in attrs.items())
    return f"<{name} {written}>{text}</{name}>"


def svg_plot(report: dict, path: Path) -> None:
    """Bars of median tokens/s per level and server, and the follow-up TTFT ratio."""
    kinds, levels = report["kinds"], report["levels"]
    colours = {"mlxspec": "#1f6feb", "mlx_vlm": "#8b949e"}
    top = max(report["median"][k][str(c)]["tok_s"] for k in kinds for c in levels) * 1.15
    width, left, base = 520, 60, 250
    title = f"{report['name']}: output tokens/s (median of {report['repeats']})"
    parts = [_tag("text", title, x=left, y=18, font_size=14)]
    parts.append(_tag("line", x1=left, y1=base, x2=width - 20, y2=base, stroke="#000"))
    slot = (width - left - 40) / len(levels)
    for i, c in enumerate(levels):
        for j, kind in enumerate(kinds):
            value = report["median"][kind][str(c)]["tok_s"]
            h = (base - 40) * value / top
            x = left + i * slot + 20 + j * 70
            parts.append(
                _tag(
                    "rect",
                    x=round(x),
                    y=round(base - h),
                    width=60,
                    height=round(h),
                    fill=colours[kind],
                )
            )
            label = f"{value:.0f}"
            parts.append(
                _tag("text", label, x=round(x + 30), y=round(base - h - 4), text_anchor="middle")
            )
        label = f"c={c} (x{report['ratios'][str(c)]:.2f})"
        parts.append(
            _tag("text", label, x=round(left + i * slot + 90), y=base + 18, text_anchor="middle")
        )
    for j, kind in enumerate(kinds):
        parts.append(
            _tag("rect", x=left + j * 110, y=base + 32, width=12, height=12, fill=colours[kind])
        )
        parts.append(_tag("text", kind, x=left + j * 110 + 16, y=base + 43))
    follow = report["follow_up"]["mlxspec"]["ratio_median"]
    parts.append(
        _tag("text", f"mlxspec 2nd turn TTFT / 1st: x{follow:.2f}", x=left + 230, y=base + 43)
    )
    head = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="520" height="300" font-family="sans-serif"'
    )
    path.write_text("\n".join([head + ' font-size="12">', *parts, "</svg>"]) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="vision-cpu")
    parser.add_argument("--model", default=None, help="default: a tiny random Qwen2.5-VL")
    parser.add_argument("--levels", default="1,8")
    parser.add_argument("--rounds", type=int, default=2, help="requests per worker at c > 1")
    parser.add_argument("--rounds-c1", type=int, default=6, help="requests at c = 1")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--follow-ups", type=int, default=3)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(HERE.parent))
    from transformers import AutoTokenizer

    from fixtures.tiny_vlm import build_tiny_vlm

    model = args.model or str(build_tiny_vlm(Path(tempfile.mkdtemp()) / "tiny-qwen-vl"))
    tokenizer = AutoTokenizer.from_pretrained(model)
    # no EOS (a fixed output length); no media or template tokens either: a random model's
    # answer holding one would be read back as a control token in the follow-up turn
    special = ["<|im_end|>", "<|im_start|>", "<|vision_start|>", "<|vision_end|>"]
    special += ["<|image_pad|>", "<|video_pad|>"]
    stops = {tokenizer.eos_token_id, *tokenizer.convert_tokens_to_ids(special)}
    bias = {str(t): -100 for t in stops if isinstance(t, int) and t >= 0}
    levels = [int(x) for x in args.levels.split(",")]
    logs = Path(os.environ.get("TMPDIR", "/tmp"))
    load = {"before": os.getloadavg()}
    servers = {
        "mlxspec": start("mlxspec", model, max(levels), logs / f"{args.name}-mlxspec.log"),
        "mlx_vlm": start("mlx_vlm", model, max(levels), logs / f"{args.name}-mlx_vlm.log"),
    }
    runs: dict[str, dict[str, list[dict]]] = {k: {str(c): [] for c in levels} for k in servers}
    follow: dict[str, list[dict]] = {k: [] for k in servers}
    try:
        for _, base in servers.values():  # warm-up, not counted
            asyncio.run(level(base, model, 2, 1, 8, bias, salt=9_000_000))
        salt = 0

        def rounds(c: int) -> int:
            return args.rounds_c1 if c == 1 else args.rounds

        for repeat in range(args.repeats):
            order = list(servers) if repeat % 2 == 0 else list(servers)[::-1]
            for c in levels:
                for kind in order:
                    salt += 100_000
                    got = asyncio.run(
                        level(servers[kind][1], model, c, rounds(c), args.max_tokens, bias, salt)
                    )
                    runs[kind][str(c)].append(got)
                    ttft = got["ttft_p50"] * 1000
                    print(f"{kind} c={c} #{repeat}: {got['tok_s']:.1f} tok/s, TTFT {ttft:.0f} ms")
        for i in range(args.follow_ups):
            order = list(servers) if i % 2 == 0 else list(servers)[::-1]
            for kind in order:
                salt += 100_000
                got = asyncio.run(follow_up(servers[kind][1], model, args.max_tokens, bias, salt))
                follow[kind].append(got)
                print(f"{kind} follow-up {i}: {got}", flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    load["after"] = os.getloadavg()
    median = {
        k: {
            c: {
                "tok_s": statistics.median(r["tok_s"] for r in rs),
                "ttft_p50": statistics.median(r["ttft_p50"] for r in rs),
            }
            for c, rs in by_level.items()
        }
        for k, by_level in runs.items()
    }
    report = {
        "name": args.name,
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "model": "tiny random Qwen2.5-VL (fixtures/tiny_vlm.py)" if args.model is None else model,
        "kinds": list(servers),  # not "servers": that key marks serve_bench reports
        "levels": levels,
        "rounds": {"c1": args.rounds_c1, "other": args.rounds},
        "repeats": args.repeats,
        "max_tokens": args.max_tokens,
        "load_average": load,
        "runs": runs,
        "median": median,
        # each repeat's pair ran back to back under the same load: the median of their ratios
        "paired_ratios": {
            str(c): statistics.median(
                a["tok_s"] / b["tok_s"]
                for a, b in zip(runs["mlxspec"][str(c)], runs["mlx_vlm"][str(c)], strict=True)
            )
            for c in levels
        },
        "ratios": {
            str(c): median["mlxspec"][str(c)]["tok_s"] / median["mlx_vlm"][str(c)]["tok_s"]
            for c in levels
        },
        "follow_up": {
            k: {
                "runs": rs,
                "ratio_median": statistics.median(ok)
                if (ok := [r["ratio"] for r in rs if "ratio" in r])
                else None,
            }
            for k, rs in follow.items()
        },
    }
    out = HERE / "results" / f"{args.name}.json"
    out.write_text(json.dumps(report, indent=1) + "\n")
    svg_plot(report, out.with_suffix(".svg"))
    print(
        json.dumps(
            {
                "ratios": report["ratios"],
                "paired": report["paired_ratios"],
                "follow_up": {k: v["ratio_median"] for k, v in report["follow_up"].items()},
                "load": load,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

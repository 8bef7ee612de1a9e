"""The ``mlxspec`` command line: ``mlxspec serve [MODEL] [flags]``."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

from .config import ServeConfig

EXIT_MODEL_ERROR = 2

#: On SIGINT/SIGTERM, how long in-flight requests may run before they are
#: cancelled, seconds (the reference's shutdown default).
DRAIN_TIMEOUT_S = 120

log = logging.getLogger("mlxspec.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mlxspec", description="OpenAI-compatible LLM server on MLX"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve a model over HTTP")
    serve.add_argument(
        "model",
        nargs="?",
        default=None,
        help="MLX model folder, Hugging Face repo id (local cache only) or .gguf file; "
        "default: the embedded SmolLM2-135M-Instruct",
    )
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8080, help="TCP port (default 8080)")
    serve.add_argument(
        "--max-tokens",
        type=_positive_int,
        default=None,
        help="default completion cap when a request sets none (default: until EOS)",
    )
    serve.add_argument("--temperature", type=float, default=None, help="default temperature")
    serve.add_argument("--top-p", type=float, default=None, help="default top_p")
    serve.add_argument("--top-k", type=int, default=None, help="default top_k")
    serve.add_argument(
        "--batch",
        type=_positive_int,
        default=8,
        help="most requests decoding at once (continuous batching); 1 = serial (default 8)",
    )
    serve.add_argument(
        "--log-level", default="info", choices=["debug", "info", "warning", "error", "critical"]
    )
    _add_cache_flags(serve)
    return parser


def _add_cache_flags(serve: argparse.ArgumentParser) -> None:
    """Prompt cache flags (sizes take a K/M/G/T suffix, powers of 1024)."""
    defaults = ServeConfig()
    serve.add_argument(
        "--prompt-cache-bytes",
        type=_byte_size,
        default=defaults.prompt_cache_bytes,
        help="RAM budget for reusing prompt-prefix KV caches across requests; 0 disables "
        "(default 1G)",
    )
    serve.add_argument(
        "--ssd-cache",
        metavar="DIR",
        default=None,
        help="keep durable prompt-cache snapshots in DIR, restored after a restart",
    )
    serve.add_argument(
        "--ssd-cache-bytes",
        type=_byte_size,
        default=defaults.ssd_cache_bytes,
        help="disk budget of --ssd-cache; the oldest snapshots go first (default 16G)",
    )


_SIZE_SUFFIXES = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _byte_size(text: str) -> int:
    """``"512M"`` -> 536870912; a bare integer is bytes."""
    body = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = body[-1:] if body[-1:] in _SIZE_SUFFIXES else ""
    try:
        value = float(body[: len(body) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError("must be a size in bytes, e.g. 1073741824 or 1G") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return int(value * _SIZE_SUFFIXES[unit])


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError("must be a TCP port, 0-65535")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return value


def parse_config(argv: Sequence[str] | None = None) -> ServeConfig:
    """Parse ``serve`` arguments into a :class:`ServeConfig` (argparse exits 2 on bad flags)."""
    args = _parser().parse_args(argv)
    return ServeConfig(
        model=args.model,
        host=args.host,
        port=args.port,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        log_level=args.log_level,
        batch=args.batch,
        prompt_cache_bytes=args.prompt_cache_bytes,
        ssd_cache=args.ssd_cache,
        ssd_cache_bytes=args.ssd_cache_bytes,
    )


def load_engine(config: ServeConfig):  # noqa: ANN201 - returns mlxspec.engine.Engine
    """Resolve and load the configured model and start its engine thread.

    Raises:
        ModelLoadError: the model is missing, unreadable or unsupported.
    """
    from .engine import Engine, GenerationDefaults
    from .engine.loader import ModelLoadError, resolve_model

    resolved = resolve_model(config.model)
    overrides = GenerationDefaults(
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        max_tokens=config.max_tokens,
    )
    try:
        engine = Engine.load(
            resolved.path,
            resolved.model_id,
            source=resolved.source,
            overrides=overrides,
            max_batch=config.batch,
            prompt_cache_bytes=config.prompt_cache_bytes,
            ssd_cache=Path(config.ssd_cache) if config.ssd_cache else None,
            ssd_cache_bytes=config.ssd_cache_bytes,
        )
    except Exception as exc:  # mlx-lm raises many types for unreadable folders
        raise ModelLoadError(f"cannot load model from {resolved.path}: {exc}") from exc
    engine.start()
    return engine


def _bind_problem(host: str, port: int) -> str | None:
    """Why ``host:port`` cannot be listened on, checked before the slow model load
    (a later race with another process still fails in uvicorn); ``None`` if it can."""
    import socket

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(infos[0][4])
    except OSError as exc:
        return exc.strerror or str(exc)
    return None


def _ssd_cache_problem(directory: str | None) -> str | None:
    """Why ``--ssd-cache`` cannot be used (checked before the model load), or ``None``."""
    import os

    if directory is None:
        return None
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return exc.strerror or str(exc)
    if not os.access(directory, os.W_OK | os.X_OK):
        return "not writable"
    return None


def serve(config: ServeConfig) -> int:
    """Load the model, then run uvicorn until interrupted. Returns an exit code."""
    import uvicorn

    from .app import create_app
    from .engine.loader import ModelLoadError

    logging.basicConfig(
        level=config.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    if (problem := _bind_problem(config.host, config.port)) is not None:
        print(
            f"mlxspec: error: cannot listen on {config.host}:{config.port}: {problem}",
            file=sys.stderr,
        )
        return EXIT_MODEL_ERROR
    if (problem := _ssd_cache_problem(config.ssd_cache)) is not None:
        print(
            f"mlxspec: error: cannot use --ssd-cache {config.ssd_cache}: {problem}", file=sys.stderr
        )
        return EXIT_MODEL_ERROR
    try:
        engine = load_engine(config)
    except ModelLoadError as exc:
        print(f"mlxspec: error: {exc}", file=sys.stderr)
        return EXIT_MODEL_ERROR
    url = f"http://{config.host}:{config.port}"
    print(
        f"mlxspec: serving {engine.info.id} (context {engine.info.context_window}) at {url}/v1",
        flush=True,
    )
    try:
        with _signals_end_serving():
            uvicorn.run(
                create_app(engine, config),
                host=config.host,
                port=config.port,
                log_level=config.log_level,
                timeout_graceful_shutdown=DRAIN_TIMEOUT_S,
            )
    finally:
        _stop_engine(engine)
    return 0


class _ShutdownSignal(Exception):
    """SIGINT or SIGTERM arrived; uvicorn has already drained the requests."""


@contextlib.contextmanager
def _signals_end_serving() -> Iterator[None]:
    """Turn SIGINT/SIGTERM into a normal return.

    uvicorn handles both while it serves (stop accepting, drain in-flight
    requests), then re-raises the signal under the handlers it found; with the
    default ones the process would die before the engine stops and the prompt
    cache is flushed.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(_sig: int, _frame: object) -> None:
        raise _ShutdownSignal

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    except _ShutdownSignal:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_engine(engine) -> None:  # noqa: ANN001 - mlxspec.engine.Engine
    """After uvicorn has drained the requests: stop the engine thread, then make
    every pending SSD prompt-cache snapshot durable (reference: shutdown flushes
    after active requests drain)."""
    from .engine import FLUSH_TIMEOUT_S

    engine.close()
    if engine.prompt_cache.ssd is None:
        return
    report = engine.prompt_cache.flush(FLUSH_TIMEOUT_S)
    level = logging.INFO if report["durable"] else logging.ERROR
    log.log(
        level,
        "prompt cache flush: durable=%s entries=%d pending=%d failed=%d",
        report["durable"],
        report["entries"],
        report["pendingSnapshots"],
        report["failedSpills"],
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point."""
    config = parse_config(argv)
    return serve(config)


if __name__ == "__main__":
    sys.exit(main())

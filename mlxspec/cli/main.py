"""The ``mlxspec`` command line: ``mlxspec serve [MODEL] [flags]``."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from mlxspec.cli.flags import parse_config
from mlxspec.cli.group_serve import (
    EXIT_GROUP_LOST,
    exit_when_lost,
    group_timeout,
    join,
    refused_on_every_rank,
    serve_follower,
)
from mlxspec.config import ServeConfig, apply_serve_env_defaults

if TYPE_CHECKING:
    from mlxspec.engine import AdapterFolder, SpeculationOptions
    from mlxspec.engine.distributed import Topology

EXIT_MODEL_ERROR = 2
#: uvicorn could not start serving (uvicorn's own ``STARTUP_FAILURE``).
EXIT_STARTUP_FAILED = 3
#: On SIGINT/SIGTERM, how long in-flight requests may run before they are
#: cancelled, seconds (the reference's shutdown default).
DRAIN_TIMEOUT_S = 120

log = logging.getLogger("mlxspec.cli.main")


def load_engine(config: ServeConfig, topology: Topology | None = None):  # noqa: ANN201 - an Engine
    """Resolve and load the configured model and start its engine thread
    (with ``topology``, only this rank's shard: :mod:`mlxspec.cli.group_serve`).

    Raises:
        ModelLoadError: the model is missing, unreadable or unsupported, or the
            admission limits leave no room for a request.
    """
    from mlxspec.engine import (
        AdapterLimits,
        AdmissionLimits,
        BudgetTooSmallError,
        Engine,
        FetchPolicy,
        GenerationDefaults,
        KvOptions,
        KvQuantError,
        SpeculationError,
    )
    from mlxspec.engine.distributed.shards import ShardError
    from mlxspec.engine.model.load import LoadOptions
    from mlxspec.engine.model.loader import ModelLoadError, resolve_model

    resolved = resolve_model(config.model)
    _warn_if_beyond_memory(config.memory_budget)
    overrides = GenerationDefaults(
        temperature=config.temperature,
        top_p=config.top_p,
        top_k=config.top_k,
        max_tokens=config.max_tokens,
        min_p=config.min_p,
        template_kwargs=config.template_defaults or None,
    )
    mount = _start_adapter(config.adapter_path)  # a LoRA is mounted, others loaded
    options = LoadOptions(
        config.adapter_path if mount is None else None,
        config.trust_remote_code,
        config.chat_template,
        config.use_default_chat_template,
    )
    try:
        engine = Engine.load(
            resolved.path,
            resolved.model_id,
            source=resolved.source,
            overrides=overrides,
            max_batch=config.batch,
            limits=AdmissionLimits(
                config.max_queue, config.max_context, config.memory_budget, config.kv_budget
            ),
            prompt_cache_bytes=config.prompt_cache_bytes,
            ssd_cache=Path(config.ssd_cache) if config.ssd_cache else None,
            ssd_cache_bytes=config.ssd_cache_bytes,
            grammar=config.grammar,
            cpu_weights=config.cpu_weights,
            warmup=config.warmup,
            load_options=options,
            prefill_step=config.prefill_step,
            prefill_batch=config.prompt_concurrency,
            prompt_cache_entries=config.prompt_cache_size,
            speculation=_speculation(config),
            fill=config.fill == "strict",
            topology=topology,
            group_timeout=group_timeout(),
            kv=KvOptions(
                config.kv_quant,
                config.kv_group_size,
                config.quantized_kv_start,
                config.kv_config,
            ),
        )
    except (BudgetTooSmallError, KvQuantError, ModelLoadError, SpeculationError) as exc:
        raise ModelLoadError(str(exc)) from exc
    except ShardError as exc:  # what the user passed, never a GGUF's converted cache folder
        size = topology.size if topology is not None else 1
        raise ModelLoadError(f"cannot shard {config.model} over {size} processes: {exc}") from exc
    except Exception as exc:  # mlx-lm raises many types for unreadable folders
        raise ModelLoadError(f"cannot load model from {resolved.path}: {exc}") from exc
    engine.adapters.limits = AdapterLimits(config.max_adapters, config.max_adapter_stack)
    engine.special_in_content = config.allow_special_tokens_in_content
    engine.media_policy = FetchPolicy(allow_private=config.allow_private_media)
    engine.start()
    if mount is not None:
        _mount_start_adapter(engine, mount)
    return engine


def _speculation(config: ServeConfig) -> SpeculationOptions | None:
    """The draft source ``--draft-model`` / ``--draft-kind`` name, or ``None``."""
    from mlxspec.engine import SpeculationOptions

    if config.draft_kind is None:
        return None
    return SpeculationOptions(config.draft_kind, config.num_draft_tokens, config.draft_model)


def _start_adapter(path: str | None) -> AdapterFolder | None:
    """The ``--adapter-path`` folder to mount as the default adapter (a LoRA
    one: hot-swappable like any mounted adapter, mixed per row), or ``None``
    when there is none or it is a DoRA or full fine-tune, which mlx-lm applies
    at load (``LoadOptions.adapter_path``, as mlx_lm.server does).

    Raises:
        ModelLoadError: the folder has no ``adapter_config.json`` (mlx_lm.server's
            check) or cannot be read as an adapter.
    """
    from mlxspec.engine import AdapterError, read_folder
    from mlxspec.engine.model.loader import ModelLoadError

    if path is None:
        return None
    if not (Path(path).expanduser() / "adapter_config.json").is_file():
        raise ModelLoadError(f"adapter not found: {path} has no adapter_config.json")
    try:
        folder = read_folder(path)
    except AdapterError as exc:
        raise ModelLoadError(f"cannot read --adapter-path {path}: {exc.message}") from exc
    return folder if folder.fine_tune_type == "lora" else None


def _mount_start_adapter(engine, folder: AdapterFolder) -> None:  # noqa: ANN001 - an Engine
    """Mount ``--adapter-path`` through the engine thread, as ``POST /v1/adapters``
    does, and make it the default adapter; its id is the folder's name.

    Raises:
        ModelLoadError: the adapter does not fit the model.
    """
    import asyncio
    import re

    from mlxspec.engine import AdapterError
    from mlxspec.engine.model.loader import ModelLoadError

    name = re.sub(r"[^A-Za-z0-9._-]", "-", folder.path.name).lstrip("._-")[:64] or "adapter"
    try:
        mounted = asyncio.run(engine.run_exclusive(lambda: engine.adapters.mount(name, folder)))
    except AdapterError as exc:
        engine.close()
        raise ModelLoadError(f"cannot mount --adapter-path {folder.path}: {exc.message}") from exc
    engine.adapters.default = name
    log.info("adapter %s mounted from %s (%d layers)", name, folder.path, mounted["mounted_layers"])


def _warn_if_beyond_memory(budget: int | None) -> None:
    """Log a warning when ``--memory-budget`` exceeds the memory of this machine
    (its RAM, or its GPU's memory when MLX runs on one): such a budget bounds
    nothing, which is likely not what the operator meant."""
    from mlxspec.host import machine

    if budget is None:
        return
    device = machine.gpu()
    total = device.memory_bytes if device is not None else machine.memory()[0]
    if total is not None and budget > total:
        log.warning(
            "--memory-budget %s bytes is more than this machine's %s (%s bytes): it limits nothing",
            budget,
            "GPU memory" if device is not None else "memory",
            total,
        )


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
    from mlxspec.host import machine

    machine.raise_open_files_limit()  # first: before anything imports mlx-lm (see there)
    from mlxspec.engine.model.loader import ModelLoadError

    logging.basicConfig(
        level=config.log_level.upper(), format="%(levelname)s %(name)s: %(message)s"
    )
    from mlxspec.engine.distributed import detect_launch

    if config.isolate and detect_launch() is None:  # only proxies: the children load the models
        from mlxspec.supervisor.serve import serve_isolated

        return serve_isolated(config)

    topology = None
    if (backend := detect_launch()) is not None or config.pipeline:
        topology = join(config, backend)  # a model sharded over mlx.launch's processes
        if isinstance(topology, int):
            return topology
        mode = "pipeline" if topology.pipeline else "tensor parallel"
        print(
            f"mlxspec: rank {topology.rank} of {topology.size} ({backend}, {mode}), "
            f"pid {os.getpid()}",
            flush=True,
        )
    if topology is not None and topology.rank != 0:  # a follower: no HTTP, rank 0's steps
        try:
            return serve_follower(load_engine(config, topology))
        except ModelLoadError as exc:
            if not refused_on_every_rank(exc):  # those rank 0 says once
                print(f"mlxspec: error: rank {topology.rank}: {exc}", file=sys.stderr)
            return EXIT_MODEL_ERROR
    if config.unix is None and (problem := _bind_problem(config.host, config.port)) is not None:
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
    if config.adapter_path:
        # before the model resolves (a GGUF is hashed, a checkpoint read): a typo fails fast
        if not (Path(config.adapter_path).expanduser() / "adapter_config.json").is_file():
            print(
                f"mlxspec: error: adapter not found: {config.adapter_path} has no "
                "adapter_config.json",
                file=sys.stderr,
            )
            return EXIT_MODEL_ERROR
    from mlxspec.cli.audio_serve import load_transcription

    try:
        load = functools.partial(load_engine, topology=topology)
        engine, transcriber = load_transcription(config, load)
    except ModelLoadError as exc:
        print(f"mlxspec: error: {exc}", file=sys.stderr)
        return EXIT_MODEL_ERROR
    if engine is None:  # serve <whisper checkpoint>: transcription only
        return _serve_app(config, None, transcriber)
    if engine.group is not None:
        exit_when_lost(engine)
        print("\n".join(engine.group.info.lines()), flush=True)  # what each rank holds
    if (weights := engine.cpu_weights) is not None and weights.reason != "not on the CPU":
        kind = "float32" if weights.float32 else "as stored"
        print(
            f"mlxspec: CPU weights {kind}, {weights.nbytes >> 20} MiB ({weights.reason})",
            flush=True,
        )
    return _serve_app(config, engine, transcriber)


def serving_lines(config: ServeConfig, engine, transcriber) -> list[str]:  # noqa: ANN001
    """The start-up lines that give the server's URLs (printed once it listens).

    Args:
        config (ServeConfig): ``host``, ``port``, ``api_key``.
        engine (Engine | None): the chat engine; ``None`` on a transcription-only server.
        transcriber (WhisperService | None): the speech-to-text service, if any.

    Returns:
        list[str]: the chat model and web chat lines, then the transcription line.
    """
    url = f"http://{config.host}:{config.port}" if config.unix is None else f"unix:{config.unix}"
    lines = []
    if engine is not None:
        auth = ", API key required" if config.api_key else ""
        cap = engine.admission.enforced_context
        capped = f", capped at {cap} by the operator's limits" if cap is not None else ""
        window = engine.info.context_window
        context = f"context {window}{capped}{auth}"
        lines.append(f"mlxspec: serving {engine.info.id} ({context}) at {url}/v1")
        lines.append(f"mlxspec: web chat at {url}/")
    if transcriber is not None:
        only = " only" if engine is None else ""
        lines.append(
            f"mlxspec: transcription{only}: {transcriber.model_id} (loads on first use) "
            f"at {url}/v1/audio/transcriptions"
        )
    return lines


def _serve_app(config: ServeConfig, engine, transcriber) -> int:  # noqa: ANN001
    """Run uvicorn on the app until interrupted, then stop the engine(s)."""
    from mlxspec.http.app import create_app
    from mlxspec.http.connections import bind_unix, uvicorn_config

    sockets = None
    if config.unix is not None:  # a worker: the unix socket, never TCP
        try:
            sockets = [bind_unix(config.unix)]
        except OSError as exc:
            print(f"mlxspec: error: cannot listen on {config.unix}: {exc}", file=sys.stderr)
            return EXIT_MODEL_ERROR

    # Building the app (the document's validators) and uvicorn's start take
    # seconds, tens of them on a busy CPU: the URLs are printed once the socket
    # listens, so a user who opens one as soon as it shows is answered.
    server = _draining_server(
        uvicorn_config(
            create_app(engine, config, transcriber=transcriber),
            config,
            timeout_graceful_shutdown=DRAIN_TIMEOUT_S,
        ),
        banner=serving_lines(config, engine, transcriber),
        group_lost=engine.group.check_now if engine is not None and engine.group else None,
    )
    _signals_force_exit()  # uvicorn's handlers replace these while it serves
    try:
        server.run(sockets=sockets)
    finally:
        if engine is not None:
            _stop_engine(engine)
        if transcriber is not None:
            transcriber.close()
    status = 0 if server.started else EXIT_STARTUP_FAILED
    if engine is not None and engine.group is not None and engine.group.failure is not None:
        status = EXIT_GROUP_LOST  # a drained shutdown after the group was lost
    _exit_after_shutdown(status)
    return 0  # not reached


def _exit_after_shutdown(status: int = 0) -> None:
    """End the process once the requests are drained, the engine thread is
    joined and the prompt cache is durable, skipping interpreter teardown: MLX's
    C++ teardown at exit can abort ("terminate called without an active
    exception", SIGABRT) while a helper thread it knows is still alive, which
    would turn a clean shutdown into exit status -6."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _draining_server(  # noqa: ANN202
    config,  # noqa: ANN001
    banner: Sequence[str] = (),
    group_lost: Callable[[], bool] | None = None,
):
    """A uvicorn server (``uvicorn.Config`` -> ``uvicorn.Server``) where the first
    SIGINT/SIGTERM drains the requests and ends ``run()`` normally, and a second
    one exits at once (:func:`_force_exit`). ``banner``'s lines are printed once
    it listens (after uvicorn's start-up; never when that fails).

    On rank 0 of a sharded model ``group_lost`` is asked first: ``mlx.launch``
    sends SIGTERM once another rank exited, and a group that is lost cannot
    drain (its steps never finish). Then the signal is left to the group's own
    end (every request answered 503, new ones too, exit code 4 within
    seconds: :func:`~mlxspec.cli.group_serve.exit_when_lost`) rather than
    closing the listener while streams wait for a step that never comes.

    Stock uvicorn re-raises the first signal once it has drained (the default
    handler would then kill the process before the engine stops and the prompt
    cache is flushed), and on a second SIGINT cancels the requests in flight,
    which printed a traceback for each, then waited on the engine. llama.cpp's
    server also exits on a second interrupt.
    """
    import uvicorn

    class DrainingServer(uvicorn.Server):
        async def startup(self, sockets: list | None = None) -> None:
            await super().startup(sockets)
            if self.started:
                for line in banner:
                    print(line, flush=True)

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if group_lost is not None and group_lost():
                return  # the group's own end answers and exits
            if self.should_exit:
                _force_exit(sig, frame)
            self.should_exit = True

    return DrainingServer(config)


def _signals_force_exit() -> None:
    """From now on a SIGINT/SIGTERM outside uvicorn's drain (during its start-up,
    or while the engine stops and the prompt cache flushes) exits at once."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _force_exit)


def _force_exit(sig: int, _frame: FrameType | None) -> None:
    """Exit now with status 128 + ``sig`` (the shell's convention) and one line
    on stderr: requests in flight are dropped and the prompt cache is not flushed."""
    with contextlib.suppress(Exception):  # a write the signal interrupted may hold the buffer
        sys.stdout.flush()
        sys.stderr.flush()
    name = signal.Signals(sig).name
    os.write(2, f"mlxspec: {name}: forced exit, requests in flight dropped\n".encode())
    os._exit(128 + sig)


def _stop_engine(engine) -> None:  # noqa: ANN001 - mlxspec.engine.Engine
    """After uvicorn has drained the requests: stop the engine thread, then make
    every pending SSD prompt-cache snapshot durable (reference: shutdown flushes
    after active requests drain)."""
    from mlxspec.engine import FLUSH_TIMEOUT_S

    engine.close()
    if engine.prompt_cache.ssd is None:
        return
    report = engine.prompt_cache.flush(FLUSH_TIMEOUT_S)
    level = logging.INFO if report["durable"] else logging.ERROR
    log.log(
        level,
        "prompt cache flush: durable=%s entries=%d pending=%d missing=%d failed=%d",
        report["durable"],
        report["entries"],
        report["pendingSnapshots"],
        report["missingSnapshots"],
        report["failedSpills"],
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Console-script entry point: ``serve``, or a model library command
    (``ls``, ``download``, ``rm``, ``gc``, ``fit``: :mod:`mlxspec.cli.library_cmds`)."""
    from mlxspec.cli.library_cmds import COMMANDS, run

    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        return run(args)
    config = parse_config(argv)
    apply_serve_env_defaults()
    return serve(config)


if __name__ == "__main__":
    sys.exit(main())

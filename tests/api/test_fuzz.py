"""schemathesis against a live ``mlxspec serve`` (CI's bounded pass).

CI fuzzes a server on the tiny random model: the wire contract does not depend
on the weights, and 19 operations x 25 cases on the embedded model outgrew CI's
time on a 2-core box. ``python -m mlxspec.conformance fuzz --examples N`` runs
the same pass against the embedded default model (or ``--url``), longer.
Unit tests of the harness's pure parts (the hooks that keep generation cheap,
the command line) come first; they need no server.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

from mlxspec.conformance import fuzz
from mlxspec.conformance.__main__ import main as conformance_main
from mlxspec.conformance.hooks import MAX_TOKENS_CAP, cap_max_tokens, trim_prompt
from mlxspec.conformance.live import serve
from mlxspec.openapi import load_spec

#: CI's examples per operation, and the outer limit (a generous bound: the
#: pass takes a few minutes on a 2-core CPU box, depending on what else runs there).
CI_EXAMPLES = 25
CI_TIME_LIMIT = 900.0
HTTP_METHODS = {"get", "put", "post", "delete", "patch", "head", "options"}


# --- hooks: cheap generation without changing what is valid ------------------


@pytest.mark.parametrize(
    "body,expected",
    [
        ({}, {"max_tokens": MAX_TOKENS_CAP}),
        ({"max_tokens": 100}, {"max_tokens": MAX_TOKENS_CAP}),
        ({"max_tokens": 2}, {"max_tokens": 2}),
        ({"max_tokens": None}, {"max_tokens": None, "max_completion_tokens": MAX_TOKENS_CAP}),
        (
            {"max_tokens": 100, "max_completion_tokens": None},
            {"max_tokens": MAX_TOKENS_CAP, "max_completion_tokens": None},
        ),
        (
            {"max_tokens": 100, "max_completion_tokens": 9},
            {"max_tokens": 100, "max_completion_tokens": MAX_TOKENS_CAP},
        ),
        # invalid values stay invalid: the server must still reject them
        ({"max_tokens": 0}, {"max_tokens": 0}),
        ({"max_tokens": 2.5}, {"max_tokens": 2.5}),
        ({"max_tokens": True}, {"max_tokens": True}),
        ({"max_completion_tokens": "9"}, {"max_completion_tokens": "9"}),
    ],
)
def test_cap_max_tokens(body: dict, expected: dict) -> None:
    assert cap_max_tokens(body) == expected
    assert body is not expected  # the input is not mutated


def test_cap_max_tokens_leaves_non_objects() -> None:
    assert cap_max_tokens([1]) == [1]
    assert cap_max_tokens(None) is None


def test_trim_prompt_shares_one_budget_and_keeps_validity() -> None:
    body = {
        "messages": [
            {"role": "user", "content": "x" * 150},
            {"role": "user", "content": [{"type": "text", "text": "y" * 100}, {"type": "z"}]},
            {"role": "user", "content": "z" * 10},
            {"role": "user"},
            {"role": "user", "content": "dropped"},
        ]
    }
    out = trim_prompt(body, budget=200, max_messages=4)
    msgs = out["messages"]
    assert len(msgs) == 4
    assert msgs[0]["content"] == "x" * 150
    assert msgs[1]["content"] == [{"type": "text", "text": "y" * 50}, {"type": "z"}]
    assert msgs[2]["content"] == "z"  # budget spent: non-empty strings stay non-empty
    assert msgs[3] == {"role": "user"}
    assert trim_prompt({"prompt": "p" * 500}, budget=10) == {"prompt": "p" * 10}
    assert trim_prompt({"prompt": ""}, budget=10) == {"prompt": ""}
    assert body["messages"][0]["content"] == "x" * 150  # not mutated


# --- command line ------------------------------------------------------------


def test_command_has_the_checks_bounds_and_unsanitized_output(tmp_path) -> None:
    opts = fuzz.FuzzOptions(base_url="http://127.0.0.1:9/", max_examples=7, seed=3)
    cmd = fuzz.build_command(opts, tmp_path / "r.json")
    arg = dict(zip(cmd, cmd[1:], strict=False))
    assert cmd[4] == "http://127.0.0.1:9/openapi.json"
    assert arg["--url"] == "http://127.0.0.1:9"
    assert arg["--checks"].split(",") == list(fuzz.CHECKS)
    assert (arg["--max-examples"], arg["--seed"]) == ("7", "3")
    assert arg["--output-sanitize"] == "false"


def test_parity_subcommand_is_delegated_lazily(monkeypatch, capsys) -> None:
    import sys
    import types

    seen: list[list[str]] = []
    stub = types.ModuleType("mlxspec.conformance.parity")
    stub.main = lambda argv: seen.append(argv) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mlxspec.conformance.parity", stub)
    assert conformance_main(["parity", "--live", "-x"]) == 0
    assert seen == [["--live", "-x"]]


def test_summary_counts_read_as_english() -> None:
    one = fuzz.FuzzResult(exit_code=0, duration=1.0, cases=1, operations=1)
    assert one.summary().startswith("fuzz ok: 1 operation, 1 case, 0 failures in 1.0s")
    many = fuzz.FuzzResult(exit_code=0, duration=2.0, cases=7, operations=3)
    assert many.summary().startswith("fuzz ok: 3 operations, 7 cases, 0 failures in 2.0s")


def test_interrupted_run_has_no_verdict(monkeypatch, capsys) -> None:
    def interrupted(_options: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(fuzz, "run_fuzz", interrupted)
    assert conformance_main(["fuzz", "--url", "http://127.0.0.1:9"]) == 130
    captured = capsys.readouterr()
    assert "fuzz interrupted: no verdict" in captured.err
    assert "FAILED" not in captured.out + captured.err


def test_unreachable_server_is_an_error_not_a_pass() -> None:
    result = fuzz.run_fuzz(
        fuzz.FuzzOptions(base_url="http://127.0.0.1:9", max_examples=1, time_limit=60)
    )
    assert not result.ok
    assert "FAILED" in result.summary()


# --- the bounded pass --------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_serve(tiny_model_dir, tmp_path_factory) -> Iterator[str]:
    """``mlxspec serve`` on the tiny random model, in a subprocess."""
    log = tmp_path_factory.mktemp("fuzz") / "serve.log"
    # an empty hub cache: fuzzed /api/gc/execute and /api/hub/download touch only it
    hub = tmp_path_factory.mktemp("fuzz-hub")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)}
    argv = [sys.executable, "-m", "mlxspec", "serve", str(tiny_model_dir), "--port", "{port}"]
    with serve(argv, env, log, timeout=120) as base:
        yield base


@pytest.mark.timeout(CI_TIME_LIMIT + 60)
def test_schemathesis_finds_nothing(tiny_serve: str) -> None:
    """Every operation, ``CI_EXAMPLES`` cases each: zero failures."""
    result = fuzz.run_fuzz(
        fuzz.FuzzOptions(
            base_url=tiny_serve,
            max_examples=CI_EXAMPLES,
            time_limit=CI_TIME_LIMIT,
            shrink=False,
        )
    )
    print(result.summary())
    assert result.ok, f"{result.summary()}\n\n{result.output[-20000:]}"
    # a TCP server without --isolate serves every operation but the worker's own
    # (x-mlxspec-unix-only: /admin/drain, /admin/lease), the parent's (GET /engine)
    # and the jobs routes (x-mlxspec-jobs: only with --jobs)
    hidden = ("x-mlxspec-unix-only", "x-mlxspec-isolate-parent", "x-mlxspec-jobs")
    operations = sum(
        1
        for item in load_spec()["paths"].values()
        for method, op in item.items()
        if method in HTTP_METHODS and not any(op.get(marker) for marker in hidden)
    )
    assert result.operations == operations


def test_header_filter_drops_values_the_client_cannot_send() -> None:
    """The seed-1 CI run drew ``session_id: "\\x856¼"`` for /v1/responses: requests
    refused it before sending (a "Network Error" that never reached the server)."""
    import requests.utils

    from mlxspec.conformance.hooks import sendable_headers

    for value in ("\x856¼", " lead", "\tx", "a\r\nb", "a\nb"):
        assert not sendable_headers({"session_id": value})
        with pytest.raises(requests.exceptions.InvalidHeader):
            requests.utils.check_header_validity(("session_id", value))
    for value in ("agent-42", "", "a b", "é", "x\x85y"):
        assert sendable_headers({"session_id": value, "x-session-affinity": "ok"})
        requests.utils.check_header_validity(("session_id", value))
    assert sendable_headers(None) and sendable_headers({})


def test_header_filter_drops_values_http_client_cannot_encode() -> None:
    """The seed-1 run after the audio and web chat operations joined drew a header value
    with ``"\U0004182d"`` for /v1/completions, /v1/messages and /v1/responses:
    ``http.client`` encodes header values as latin-1 and raised before sending."""
    import http.client

    from mlxspec.conformance.hooks import sendable_headers

    value = "agent\U0004182d"
    assert not sendable_headers({"session_id": value})
    connection = http.client.HTTPConnection("127.0.0.1")
    connection.putrequest("GET", "/")
    with pytest.raises(UnicodeEncodeError):
        connection.putheader("session_id", value)
    assert sendable_headers({"session_id": "caf\xe9"})

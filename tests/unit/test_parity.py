"""Parity with mlx_lm.server: the comparator and the case files, with no model.

Recorded mode, mlxspec on the embedded model against mlx_lm.server's responses
stored in ``fixtures/parity/reference/``, is ``tests/real/test_parity.py``; the
live run (both servers) is ``python -m mlxspec.conformance parity --live``, its
table ``docs/parity-report.md``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mlxspec.conformance import parity
from mlxspec.conformance.parity import Case, check, diff, load_cases, parse_sse

ROOT = Path(__file__).resolve().parents[2]
CASES = load_cases()
DEVIATIONS = (ROOT / "docs" / "deviations.md").read_text()


# The comparator -------------------------------------------------------------


def test_diff_is_exact_on_ints_text_and_bools_and_tolerant_on_floats() -> None:
    assert diff({"id": 5, "t": "a", "lp": -0.5}, {"id": 5, "t": "a", "lp": -0.50009}) == []
    assert diff({"lp": -0.5}, {"lp": -0.5002}) == [".lp: -0.5 != -0.5002 (tol 0.0001)"]
    assert diff({"id": 5}, {"id": 6}) == [".id: 5 != 6"]
    assert diff(True, 1) and diff(None, "") and diff("a", "b")
    assert diff([1, 2], [1, 2, 3]) == [".: 2 items != 3"]
    assert diff({"a": 1}, {"a": 1, "b": 2})
    assert diff([[{"x": 1.0}]], [[{"x": 1.00001}]]) == []


def test_parse_sse_skips_comments_and_reads_done() -> None:
    text = ': keepalive 1/2\n\ndata: {"id": "x", "choices": []}\n\ndata: [DONE]\n\n'
    events, done = parse_sse(text)
    assert events == [{"choices": []}] and done


MLX_LM_TOP = {
    "json": {
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Hi"},
                "logprobs": {
                    "content": [
                        {
                            "id": 2,
                            "token": "b",
                            "logprob": -2.0,
                            "top_logprobs": [
                                {"id": 2, "token": "b", "logprob": -2.0},
                                {"id": 1, "token": "a", "logprob": -0.1},
                            ],
                        }
                    ]
                },
            }
        ]
    },
    "status": 200,
}


def _ours_top(entry_first: bool = True) -> dict:
    top = [{"id": 1, "token": "a", "logprob": -0.1}, {"id": 2, "token": "b", "logprob": -2.0}]
    if not entry_first:
        top.reverse()
    body = json.loads(json.dumps(MLX_LM_TOP))
    body["json"]["choices"][0]["logprobs"]["content"] = [dict(top[0], top_logprobs=top)]
    return body


def test_top_logprobs_compare_as_sets_and_argmax() -> None:
    case = Case("c", "/v1/chat/completions", {}, ("content", "top_logprobs", "top_choice"))
    assert check(case, _ours_top(), MLX_LM_TOP).verdict == "identical"
    # ours must follow the reference: sorted descending, entry = the argmax
    bad = check(case, _ours_top(entry_first=False), MLX_LM_TOP)
    assert bad.verdict == "differs" and "top_order" in bad.fields


def test_error_message_reads_both_envelopes() -> None:
    ours = {"status": 400, "json": {"error": {"message": "m", "type": "invalid_request_error"}}}
    ref = {"status": 400, "json": {"error": "m"}}
    assert check(Case("e", "/r", {}, ("status", "error_message")), ours, ref).ok


def test_stream_fields_join_deltas_and_take_usage_from_any_chunk() -> None:
    ours = {
        "status": 200,
        "events": [
            {"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]},
            {"choices": [{"delta": {"content": "Hi"}, "finish_reason": None}]},
            {
                "choices": [{"delta": {}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            },
        ],
        "done": True,
    }
    ref = {
        "status": 200,
        "events": [
            {"choices": [{"delta": {"role": "assistant", "content": "Hi"}, "finish_reason": None}]},
            {"choices": [{"delta": {"role": "assistant"}, "finish_reason": "stop"}]},
            {
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
            },
        ],
        "done": True,
    }
    case = Case("s", "/r", {}, ("content", "finish_reason", "usage", "role", "done"))
    assert check(case, ours, ref).verdict == "identical"


def test_deviation_needs_the_expected_value() -> None:
    dev = {"row": "Stop strings", "fields": ["content"], "expect": {"content": "A"}}
    case = Case("d", "/r", {}, ("content",), deviation=dev)
    ref = {"json": {"choices": [{"text": "B"}]}}
    assert check(case, {"json": {"choices": [{"text": "A"}]}}, ref).verdict == "deviation"
    assert check(case, {"json": {"choices": [{"text": "C"}]}}, ref).verdict == "differs"


# The case files and recordings -----------------------------------------------


def test_cases_cover_the_issue() -> None:
    assert len(CASES) >= 40
    assert len({c.name for c in CASES}) == len(CASES)
    matched = {f for c in CASES for f in c.match}
    assert matched <= set(parity.FIELDS)
    for needed in (
        "content",
        "token_ids",
        "logprobs",
        "top_logprobs",
        "usage",
        "finish_reason",
        "error_message",
        "models_shape",
        "raw",
    ):
        assert needed in matched
    for c in CASES:
        if c.body is not None:
            assert "max_tokens" in c.body and c.body["temperature"] == 0, c.name
            assert "model" not in c.body, c.name  # mlx_lm.server would try to load it


@pytest.mark.parametrize("case", [c for c in CASES if c.deviation], ids=lambda c: c.name)
def test_every_deviation_is_listed(case: Case) -> None:
    assert f"| {case.deviation['row']} |" in DEVIATIONS
    assert set(case.deviation.get("expect", {})) <= set(case.match)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_recording_is_for_this_request(case: Case) -> None:
    record = json.loads(parity.reference_path(case).read_text())
    assert record["request"] == {"route": case.route, "body": case.body}
    assert record["mlx_lm_version"] and record["model"]


def test_cli_record_needs_live(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parity.main(["--record"])
    assert exc.value.code == 2 and "--record needs --live" in capsys.readouterr().err


def test_table_names_the_differing_fields() -> None:
    rows = [
        parity.Outcome("a", "/health", "identical"),
        parity.Outcome("b", "/v1/completions", "deviation", ["content"], "Stop strings"),
        parity.Outcome("c", "/v1/completions", "differs", ["usage"], "usage.total_tokens: 3 != 4"),
    ]
    text = parity.table(rows)
    assert "| a | `/health` | identical |" in text
    assert "deviation (Stop strings): content" in text
    assert "**DIFFERS**: usage usage.total_tokens: 3 != 4" in text
    assert parity.summary(rows).startswith("3 cases: 1 identical, 1 listed deviations, 1 differ")


# /v1/models with a Whisper checkpoint (issue 25 item 8) ------------------------

_CHAT_ROW = {"id": "SmolLM2-135M-Instruct", "object": "model", "created": 1, "owned_by": "mlxspec"}
_WHISPER_ROW = {"id": "whisper-base", "object": "model", "created": 2, "owned_by": "mlxspec"}


def _models(*rows: dict) -> dict:
    return {
        "status": 200,
        "content_type": "application/json",
        "json": {"object": "list", "data": list(rows)},
    }


def test_models_list_lets_the_whisper_row_through_as_a_listed_deviation() -> None:
    case = next(c for c in CASES if c.name == "models_list")
    ref = parity.load_reference(case)
    assert check(case, _models(_CHAT_ROW), ref).verdict == "identical"
    with_whisper = check(case, _models(_CHAT_ROW, _WHISPER_ROW), ref)
    assert (with_whisper.verdict, with_whisper.fields) == ("deviation", ["models_shape"])
    assert with_whisper.detail == "`/v1/models` rows"


def test_models_list_still_checks_every_rows_shape() -> None:
    case = next(c for c in CASES if c.name == "models_list")
    ref = parity.load_reference(case)
    bad_row = {**_WHISPER_ROW, "created": "2"}
    assert check(case, _models(_CHAT_ROW, bad_row), ref).verdict == "differs"
    assert check(case, _models(), ref).verdict == "differs"
    assert check(case, {**_models(_CHAT_ROW), "status": 503}, ref).verdict == "differs"

"""``mlxspec serve`` is a drop-in for ``mlx_lm.server``: one mlx_lm.server
command line (a LoRA adapter, a chat template of its own with a variable from
``--chat-template-args``, the sampling and batching flags) starts both servers,
and their greedy answers are the same (the parity harness,
:func:`mlxspec.conformance.parity.fetch_both`; mlxspec with ``--cpu-weights
native``, as the parity runs, so the arithmetic matches)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.tiny_model import CHATML_TEMPLATE, build_tiny_adapter, build_tiny_llama
from mlxspec.conformance.parity import Case, check, fetch_both

#: ChatML with a system line from a template variable the server flags set.
TEMPLATE = (
    "{% if greeting is defined %}<|im_start|>system\n{{ greeting }}<|im_end|>\n{% endif %}"
    + CHATML_TEMPLATE
)
ASK = [{"role": "user", "content": "hello there"}]
TEXT = ("content", "finish_reason", "usage")

CASES = [
    Case("chat", "/v1/chat/completions", {"messages": ASK}, ("status", "role", *TEXT)),
    Case("chat_short_path", "/chat/completions", {"messages": ASK}, ("status", *TEXT)),
    Case(
        "chat_stream",
        "/v1/chat/completions",
        {"messages": ASK, "stream": True},
        ("status", "content", "finish_reason", "done"),
    ),
    Case("completion", "/v1/completions", {"prompt": "Once upon a time"}, ("status", *TEXT)),
    Case(
        "chat_overrides",
        "/v1/chat/completions",
        {"messages": ASK, "max_tokens": 5, "chat_template_kwargs": {"greeting": "Be terse."}},
        ("status", *TEXT),
    ),
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp = tmp_path_factory.mktemp("drop-in")
    model = build_tiny_llama(tmp / "model", seed=3)
    return model, build_tiny_adapter(model, tmp / "adapter")


def test_same_mlx_lm_server_line_same_greedy_answers(folders: tuple[Path, Path]) -> None:
    model, adapter = folders
    line = [
        "--model", str(model),
        "--adapter-path", str(adapter),
        "--host", "127.0.0.1",
        "--port", "{port}",
        "--chat-template", TEMPLATE,
        "--chat-template-args", json.dumps({"greeting": "You are kind."}),
        "--temp", "0.0",
        "--top-p", "1.0",
        "--top-k", "0",
        "--min-p", "0.0",
        "--max-tokens", "12",
        "--decode-concurrency", "4",
        "--prompt-concurrency", "2",
        "--prefill-step-size", "64",
        "--prompt-cache-size", "4",
        "--prompt-cache-bytes", "64MB",
        "--log-level", "INFO",
        "--allowed-origins", "*",
        "--trust-remote-code",
    ]  # fmt: skip
    answers = {}
    for case, ours, ref in fetch_both(CASES, line):
        outcome = check(case, ours, ref)
        assert outcome.verdict == "identical", (case.name, outcome.detail, ours, ref)
        answers[case.name] = ours
    # the adapter and the template's system line were used: the bare model differs
    reply, prompt_tokens = bare(model)
    chat = answers["chat"]["json"]
    assert chat["choices"][0]["message"]["content"] != reply
    assert chat["usage"]["prompt_tokens"] > prompt_tokens


def bare(model: Path) -> tuple[str, int]:
    """The model's own greedy reply to :data:`ASK` (no adapter, its own template)
    and the length of that prompt."""
    from mlx_lm import generate, load

    net, tokenizer = load(str(model))[:2]
    prompt = tokenizer.apply_chat_template(ASK, add_generation_prompt=True)
    return generate(net, tokenizer, prompt, max_tokens=12), len(prompt)

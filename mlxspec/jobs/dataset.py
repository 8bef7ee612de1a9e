"""The dataset builder (reference, "Dataset"): a registry of templates, each
turning a form's inputs into a JSONL training file, run as a job.

A template answers its ``GET /api/dataset/templates`` entry (:data:`TEMPLATES`)
and has a builder ``inputs -> rows``. The output is a data folder the fine-tune
job takes: ``train.jsonl`` under ``<mlxspec cache>/datasets/dataset-<template>-<ts>``.
The LLM-backed template calls this server's own ``/v1/chat/completions`` (its base
URL in ``MLXSPEC_JOB_API``, the API key in ``MLXSPEC_JOB_API_KEY``), greedily.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from mlxspec.jobs.runner import Emit, JobRefused

__all__ = ["TEMPLATES", "run_dataset", "template"]

Rows = list[dict[str, Any]]


def _field(name: str, kind: str, label: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": kind, "label": label, **extra}


#: The registry: one entry per template, in the reference's ``templates`` shape.
TEMPLATES: list[dict[str, Any]] = [
    {
        "id": "qa_pairs", "label": "Q&A pairs",
        "description": "Pasted question/answer pairs ('Q:' and 'A:' lines, a blank line "
        "between pairs) as prompt/completion rows.",
        "output_format": "prompt_completion", "needs_llm": False,
        "fields": [_field("pairs", "textarea", "Pairs", required=True,
                          hint="Q: question\nA: answer")],
    },
    {
        "id": "chat_transcripts", "label": "Chat transcripts",
        "description": "Transcripts ('User:', 'Assistant:', 'System:' lines; '---' between "
        "conversations) as messages rows.",
        "output_format": "messages", "needs_llm": False,
        "fields": [_field("transcripts", "textarea", "Transcripts", required=True)],
    },
    {
        "id": "text_chunks", "label": "Text file to text rows",
        "description": "A text file (a path under the allowed roots) or pasted text, split "
        "at paragraph breaks into rows of at most chunk_chars characters.",
        "output_format": "text", "needs_llm": False,
        "fields": [_field("path", "text", "File path"), _field("text", "textarea", "Text"),
                   _field("chunk_chars", "number", "Characters per row", default=1000)],
    },
    {
        "id": "llm_qa", "label": "Q&A about a text (LLM)",
        "description": "Asks the served model for questions about a text and answers them "
        "from it, as messages rows.",
        "output_format": "messages", "needs_llm": True,
        "fields": [_field("text", "textarea", "Source text", required=True),
                   _field("n_pairs", "number", "Pairs", default=5),
                   _field("max_tokens", "number", "Tokens per reply", default=128)],
    },
]  # fmt: skip


def template(template_id: str) -> dict[str, Any] | None:
    """The registry entry ``template_id``, or ``None``."""
    return next((t for t in TEMPLATES if t["id"] == template_id), None)


def _text(inputs: dict[str, Any], name: str) -> str:
    value = inputs.get(name)
    if not isinstance(value, str) or not value.strip():
        raise JobRefused(f"inputs.{name} is required")
    return value


def qa_pairs(inputs: dict[str, Any], emit: Emit) -> Rows:
    """``Q:``/``A:`` blocks -> ``{"prompt", "completion"}`` rows."""
    rows = []
    for number, block in enumerate(re.split(r"\n\s*\n", _text(inputs, "pairs").strip()), 1):
        match = re.match(r"\s*Q:\s*(.+?)\n\s*A:\s*(.+)\Z", block, re.S)
        if not match:
            raise JobRefused(f"inputs.pairs: pair {number} has no 'Q:' line then an 'A:' line")
        rows.append({"prompt": match[1].strip(), "completion": match[2].strip()})
    return rows


_SPEAKERS = {"user": "user", "assistant": "assistant", "system": "system"}


def chat_transcripts(inputs: dict[str, Any], emit: Emit) -> Rows:
    """Transcripts -> ``{"messages": [...]}`` rows; a line without a speaker
    continues the message before it."""
    rows = []
    convos = re.split(r"^\s*---\s*$", _text(inputs, "transcripts"), flags=re.M)
    for number, convo in enumerate(convos, 1):
        messages: list[dict[str, str]] = []
        for line in convo.strip().splitlines():
            head, _, rest = line.partition(":")
            role = _SPEAKERS.get(head.strip().lower())
            if role:
                messages.append({"role": role, "content": rest.strip()})
            elif messages:
                messages[-1]["content"] += "\n" + line
            elif line.strip():
                raise JobRefused(
                    f"inputs.transcripts: conversation {number} opens without a speaker"
                )
        if messages:
            if not any(m["role"] == "assistant" for m in messages):
                raise JobRefused(f"inputs.transcripts: conversation {number} has no assistant turn")
            rows.append({"messages": messages})
    return rows


def _chunks(text: str, limit: int) -> Iterator[str]:
    current = ""
    for para in (p.strip() for p in re.split(r"\n\s*\n", text)):
        while len(para) > limit:
            if current:
                yield current
                current = ""
            yield para[:limit]
            para = para[limit:]
        if current and len(current) + 2 + len(para) > limit:
            yield current
            current = ""
        current = f"{current}\n\n{para}" if current else para
    if current:
        yield current


def text_chunks(inputs: dict[str, Any], emit: Emit) -> Rows:
    """A file (``path``, confined by the route) or ``text`` -> ``{"text"}`` rows."""
    limit = int(inputs.get("chunk_chars") or 1000)
    if limit < 1:
        raise JobRefused("inputs.chunk_chars must be at least 1")
    if inputs.get("path"):
        text = Path(inputs["path"]).read_text(encoding="utf-8", errors="replace")
    else:
        text = _text(inputs, "text")
    return [{"text": chunk} for chunk in _chunks(text, limit) if chunk]


def _chat(messages: list[dict[str, str]], max_tokens: int, model: str | None) -> str:
    """One greedy chat completion from this server's own ``/v1``."""
    import httpx

    base = os.environ.get("MLXSPEC_JOB_API")
    if not base:
        raise JobRefused("the LLM-backed template needs the server's address (MLXSPEC_JOB_API)")
    headers = {}
    if key := os.environ.get("MLXSPEC_JOB_API_KEY"):
        headers["Authorization"] = f"Bearer {key}"
    body: dict[str, Any] = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
    if model:
        body["model"] = model
    reply = httpx.post(f"{base}/v1/chat/completions", json=body, headers=headers, timeout=600)
    reply.raise_for_status()
    return str(reply.json()["choices"][0]["message"]["content"] or "").strip()


#: The LLM-backed template's prompts (``{text}``, ``{n}``, ``{question}``).
QUESTION_PROMPT = (
    "Read this text, then write question number {n} about it, one line only.\n\n{text}"
)
ANSWER_PROMPT = "Answer the question from the text.\n\nText:\n{text}\n\nQuestion: {question}"


def llm_qa(inputs: dict[str, Any], emit: Emit) -> Rows:
    """Questions about ``text`` and their answers, each asked of the served model."""
    text, model = _text(inputs, "text"), inputs.get("model_name")
    pairs, max_tokens = int(inputs.get("n_pairs") or 5), int(inputs.get("max_tokens") or 128)
    if not 1 <= pairs <= 1000 or not 1 <= max_tokens <= 8192:
        raise JobRefused("inputs.n_pairs must be 1..1000 and inputs.max_tokens 1..8192")
    rows = []
    for n in range(1, pairs + 1):
        ask = QUESTION_PROMPT.format(n=n, text=text)
        question = _chat([{"role": "user", "content": ask}], max_tokens, model)
        prompt = ANSWER_PROMPT.format(text=text, question=question)
        answer = _chat([{"role": "user", "content": prompt}], max_tokens, model)
        rows.append({"messages": [{"role": "user", "content": question},
                                  {"role": "assistant", "content": answer}]})  # fmt: skip
        emit(
            {"type": "stage", "stage": "generate", "progress": n / pairs, "message": f"{n}/{pairs}"}
        )
    return rows


_BUILDERS: dict[str, Callable[[dict[str, Any], Emit], Rows]] = {
    "qa_pairs": qa_pairs, "chat_transcripts": chat_transcripts,
    "text_chunks": text_chunks, "llm_qa": llm_qa,
}  # fmt: skip


def run_dataset(body: dict[str, Any], emit: Emit) -> tuple[str, dict[str, Any]]:
    """Run a dataset job (in the runner process).

    Args:
        body (dict): ``template_id``, ``inputs``, ``model_name``, ``output_dir``.
        emit (Emit): the job's event sink.

    Returns:
        tuple[str, dict]: the data folder and ``{template_id, rows, format}``.

    Raises:
        JobRefused: an input the template cannot use (named), or no rows.
    """
    inputs = dict(body.get("inputs") or {})
    if body.get("model_name"):
        inputs.setdefault("model_name", body["model_name"])
    entry = template(body["template_id"])
    if entry is None:
        raise JobRefused(f"unknown template {body['template_id']!r}")
    rows = _BUILDERS[entry["id"]](inputs, emit)
    if not rows:
        raise JobRefused("the inputs gave no rows")
    out = Path(body["output_dir"])
    out.mkdir(parents=True, exist_ok=True)
    with (out / "train.jsonl").open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    summary = {"template_id": entry["id"], "rows": len(rows), "format": entry["output_format"]}
    return str(out), summary

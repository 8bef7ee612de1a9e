"""Structured output on the handler side: compile before submitting, degrade if it fails.

A constraint whose grammar does not compile (or any constraint under
``MLXSPEC_GRAMMAR=0``) is never a 4xx/5xx (reference, "Structured output",
degrade path): the request runs without the grammar, the response carries a
``Warning: grammar not enforced: <reason>`` header, and on chat the constraint
is described to the model in a system instruction instead (a text completion
has no template to put one in). The grammar is compiled here, on a worker
thread, before the request is submitted, so the header is known before the
response starts; the engine then finds it in its cache.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from typing import Any

from mlxspec.engine import Constraint, EngineProtocol
from mlxspec.handlers.requests import STRUCTURED_FIELDS, to_constraint

#: Longest ``Warning`` header value sent (reasons can quote a whole grammar).
MAX_WARNING = 400


async def structured_output(
    engine: EngineProtocol, body: dict[str, Any], *, chat: bool
) -> tuple[dict[str, Any], dict[str, str]]:
    """Check a body's constraint compiles; if not, switch to the degrade path.

    Args:
        engine (EngineProtocol): the serving engine (its grammar cache compiles).
        body (dict): a validated chat or completion body.
        chat (bool): ``True`` for chat bodies (describe the constraint in a
            system instruction), ``False`` for text completions (header only).

    Returns:
        tuple: the body to run (unchanged when the constraint compiles or there
        is none; otherwise without its structured-output fields, and for chat
        with the instruction) and the extra response headers (``{}`` or
        ``{"Warning": ...}``).
    """
    constraint = to_constraint(body)
    if constraint is None:
        return body, {}
    reason = await asyncio.to_thread(engine.grammar_problem, constraint)
    if reason is None:
        return body, {}
    return degraded_body(body, constraint, chat=chat), warning_header(reason)


def warning_header(reason: str) -> dict[str, str]:
    """The ``Warning`` header for a constraint that is not enforced.

    Args:
        reason (str): why (a compile error or the ``MLXSPEC_GRAMMAR=0`` notice).

    Returns:
        dict[str, str]: ``{"Warning": "grammar not enforced: <reason>"}``, one
        ASCII line (non-ASCII escaped, whitespace collapsed) of at most
        :data:`MAX_WARNING` characters, as HTTP header values must be.
    """
    text = " ".join(reason.encode("ascii", "backslashreplace").decode("ascii").split())
    value = f"grammar not enforced: {text}"
    if len(value) > MAX_WARNING:
        value = value[: MAX_WARNING - 3] + "..."
    return {"Warning": value}


def degraded_body(body: Mapping[str, Any], constraint: Constraint, *, chat: bool) -> dict:
    """``body`` without its structured-output fields; for chat, with the
    constraint described in a leading system instruction (pure, see
    :func:`with_system_note`)."""
    out = {k: v for k, v in body.items() if k not in STRUCTURED_FIELDS}
    return with_system_note(out, instruction(constraint)) if chat else out


def with_system_note(body: Mapping[str, Any], note: str) -> dict[str, Any]:
    """A chat ``body`` whose leading system instruction starts with ``note`` (pure).

    The note joins a leading system message with string content rather than
    adding a second one: many chat templates accept only one, first.
    """
    messages = list(body["messages"])
    first = messages[0] if messages else None
    if first and first.get("role") == "system" and isinstance(first.get("content"), str):
        messages[0] = {**first, "content": f"{note}\n\n{first['content']}"}
    else:
        messages.insert(0, {"role": "system", "content": note})
    return {**body, "messages": messages}


def instruction(constraint: Constraint) -> str:
    """A system instruction asking the model to follow ``constraint`` (pure).

    Args:
        constraint (Constraint): the constraint that is not enforced.

    Returns:
        str: the instruction text, quoting the schema, regex, grammar or choices.
    """
    kind, spec = constraint.kind, constraint.spec
    if kind == "json_object":
        return "Reply with valid JSON only (an object or an array), and no other text."
    if kind == "json_schema":
        return f"Reply with JSON only, and no other text, that matches this JSON Schema:\n{spec}"
    if kind == "regex":
        return f"Reply only with text that fully matches this regular expression:\n{spec}"
    if kind == "ebnf":
        return f"Reply only with text that this EBNF grammar (start rule root) accepts:\n{spec}"
    if kind == "choice":
        options = "\n".join(f"- {json.dumps(c, ensure_ascii=False)}" for c in json.loads(spec))
        return f"Reply with exactly one of these options, unquoted, and nothing else:\n{options}"
    return f"Reply following this output structure:\n{spec}"

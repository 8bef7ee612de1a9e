"""``POST /v1/decisions`` (``createDecision``) and ``POST /v1/systemone``
(``createSystemOneDecision``): score fixed answers, generate nothing.

Both contracts parse into one :class:`~.decision_wire.DecisionRequest`
(:mod:`.decision_wire`); each question is one prompt whose candidate answers
the engine scores (``engine.score``, :func:`mlxspec.engine.score_answers`),
and the probabilities become the contract's answer objects.
"""

from __future__ import annotations

from typing import Any

from mlxspec.engine import PromptError
from mlxspec.errors import ApiError
from mlxspec.handlers.context import JSON, current_engine
from mlxspec.handlers.decisions.wire import (
    DecisionRequest,
    answer_texts,
    parse_openai,
    parse_systemone,
    question_messages,
    render_answer,
)
from mlxspec.handlers.events import until_disconnect


async def create_decision(body: dict[str, Any]) -> Any:
    """Answer an OpenAI decisions request: a list of answers plus usage."""
    model, answers, used = await _decide(parse_openai(body), systemone=False)
    usage = {
        "input_tokens": used,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": used,
    }
    return {"model": model, "answers": answers, "usage": usage}, 200, JSON


async def create_system_one_decision(body: dict[str, Any]) -> Any:
    """Answer a System One request: answers keyed by question name, plus usage."""
    request = parse_systemone(body)
    model, answers, used = await _decide(request, systemone=True)
    keyed = {q.name: a for q, a in zip(request.questions, answers, strict=True)}
    usage = {"input_tokens": used, "output_tokens": 0}
    return {"model": model, "answers": keyed, "usage": usage}, 200, JSON


async def _decide(request: DecisionRequest, systemone: bool) -> tuple[str, list[dict], int]:
    """Score every question in order; returns (model id, answers, input tokens).

    Raises:
        ApiError: the prompt cannot be built (e.g. images on a text-only
            model), naming ``state`` or ``input``; ``cancelled`` if the client
            leaves.
        ContextLengthError: a prompt plus an answer exceeds the context window.
        QueueFullError: ``--max-queue`` requests already wait (429 ``queue_full``).
    """
    engine = current_engine()
    answers, used = [], 0
    # One place in the admission queue for the whole request, like a generation.
    with engine.hold("decision"):
        for question in request.questions:
            messages = question_messages(request, question)
            try:
                scored = await until_disconnect(engine.score(messages, answer_texts(question)))
            except PromptError as exc:
                raise ApiError(
                    "invalid_request", exc.message, param="state" if systemone else "input"
                ) from exc
            answers.append(render_answer(question, scored.probabilities, systemone))
            used += scored.input_tokens
    return engine.info.id, answers, used

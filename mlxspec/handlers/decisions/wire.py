"""Decision requests <-> scoring: both wire contracts, prompts and answers.

Pure functions, no engine. The OpenAPI document has already checked types,
enums, counts and required fields; what is left here is what a schema cannot
say (unique choice values, the image count, nesting depth, asset references),
the conversion of both contracts into one :class:`DecisionRequest`, the prompt
and candidate answers per question, and the answer objects with their
confidence statistic. Behaviour follows the reference's decision routes
(``decision-wire.ts`` in mlx-bun 1.0); messages name fields with dotted paths.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from mlxspec.errors import ApiError

#: Most images one OpenAI decision request may carry.
MAX_IMAGES = 128
#: Deepest JSON nesting accepted in System One text values.
MAX_DEPTH = 64


@dataclass(frozen=True)
class Option:
    """One allowed answer.

    Args:
        value (str | bool | int): the wire value (a level index for scores).
        label (str): a score level's text (the JSON of ``value`` otherwise).
        description (str): shown after the answer in the prompt's menu.
        legend (Any): System One only: the level exactly as the request gave it.
    """

    value: str | bool | int
    label: str
    description: str = ""
    legend: Any = None


@dataclass(frozen=True)
class Question:
    """One question: its kind, optional name, instructions and answers.

    Args:
        kind (str): ``predicate``, ``choice`` or ``score`` (System One's
            ``noul`` is a predicate).
        name (str | None): echoed in answers (System One: the key).
        instructions (str): the question text.
        options (tuple[Option, ...]): allowed answers; scores lowest first.
        images (tuple[dict, ...]): ``image_url`` content parts it refers to.
    """

    kind: Literal["predicate", "choice", "score"]
    name: str | None
    instructions: str
    options: tuple[Option, ...]
    images: tuple[dict, ...] = ()


@dataclass(frozen=True)
class DecisionRequest:
    """A parsed decision request: user content and the questions about it."""

    input: tuple[dict, ...]
    questions: tuple[Question, ...]


def _predicate_options(
    no: str = "The condition does not hold (no).", yes: str = "The condition holds (yes)."
) -> tuple[Option, ...]:
    return (Option(False, "false", no), Option(True, "true", yes))


def compact_json(value: Any) -> str:
    """``JSON.stringify``-style JSON: compact, non-ASCII kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def parse_openai(body: Mapping[str, Any]) -> DecisionRequest:
    """An OpenAI decisions body (validated by the document) as a :class:`DecisionRequest`.

    Raises:
        ApiError: more than 128 images (``input``), or repeated choice values
            (``questions.<i>.choices``).
    """
    raw = body["input"]
    messages = (
        [{"role": "user", "content": raw}]
        if isinstance(raw, str)
        else [{"role": "user", "content": _openai_content(m["content"])} for m in raw]
    )
    images = sum(
        1
        for m in messages
        if isinstance(m["content"], list)
        for part in m["content"]
        if part["type"] == "image_url"
    )
    if images > MAX_IMAGES:
        raise ApiError(
            "invalid_request", f"input: supports at most {MAX_IMAGES} images", param="input"
        )
    return DecisionRequest(
        tuple(messages), tuple(_openai_question(i, q) for i, q in enumerate(body["questions"]))
    )


def _openai_content(content: str | list) -> str | list[dict]:
    if isinstance(content, str):
        return content
    parts: list[dict] = []
    for part in content:
        if part["type"] == "input_text":
            parts.append({"type": "text", "text": part["text"]})
        else:
            url = {
                "url": part["image_url"],
                **({"detail": part["detail"]} if part.get("detail") else {}),
            }
            parts.append({"type": "image_url", "image_url": url})
    return parts


def _openai_question(i: int, q: Mapping[str, Any]) -> Question:
    kind, name, text = q["type"], q.get("name"), q["instructions"]
    if kind == "predicate":
        return Question("predicate", name, text, _predicate_options())
    if kind == "choice":
        options = tuple(
            Option(c["value"], compact_json(c["value"]), c.get("description", ""))
            for c in q["choices"]
        )
        if len({o.label for o in options}) != len(options):
            field = f"questions.{i}.choices"
            raise ApiError(
                "invalid_request",
                f"{field}: values must be unique (strings and booleans are distinct)",
                param=field,
            )
        return Question("choice", name, text, options)
    levels = tuple(
        Option(j, lv["label"], lv.get("description", "")) for j, lv in enumerate(q["levels"])
    )
    return Question("score", name, text, levels)


def _as_text(value: Any, field: str) -> str:
    """A System One text value: a string as is, null as "", JSON otherwise."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    _check_depth(value, field)
    return compact_json(value)


def _check_depth(value: Any, field: str) -> None:
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ApiError(
                "invalid_request", f"{field}: exceeds {MAX_DEPTH} nested levels", param=field
            )
        children = (
            item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        )
        stack.extend((child, depth + 1) for child in children)


class _Assets:
    """Image assets by reference, and which of them values refer to.

    Only values refer to images (never keys). A value equal to a reference is
    that image; otherwise references are found left to right, the earliest
    (then longest) match first.
    """

    def __init__(self, raw: Mapping[str, Any] | None) -> None:
        self.urls = {
            ref: f"data:image/{'png' if a['format'] == 'png' else 'jpeg'};base64,{a['data_base64']}"
            for ref, a in (raw or {}).items()
        }
        self.used: set[str] = set()

    def images_in(self, value: Any) -> list[dict]:
        """``image_url`` parts (each after a text part naming it) for references in ``value``."""
        if isinstance(value, dict | list):
            items = value.values() if isinstance(value, dict) else value
            return [part for child in items for part in self.images_in(child)]
        if not isinstance(value, str) or not self.urls:
            return []
        refs = [value] if value in self.urls else self._scan(value)
        self.used.update(refs)
        return [
            part
            for ref in refs
            for part in (
                {"type": "text", "text": f"Image reference: {ref}"},
                {"type": "image_url", "image_url": {"url": self.urls[ref]}},
            )
        ]

    def _scan(self, text: str) -> list[str]:
        found: list[str] = []
        position = 0
        while True:
            hits = [(text.find(ref, position), -len(ref), ref) for ref in self.urls]
            hits = [hit for hit in hits if hit[0] >= 0]
            if not hits:
                return found
            at, _, ref = min(hits)
            found.append(ref)
            position = at + len(ref)


def parse_systemone(body: Mapping[str, Any]) -> DecisionRequest:
    """A System One body (validated by the document) as a :class:`DecisionRequest`.

    Raises:
        ApiError: a text value nested deeper than 64 levels, or an asset no
            value refers to (``assets``).
    """
    assets = _Assets(body.get("assets"))
    state = _as_text(body["state"], "state")
    state_images = assets.images_in(body["state"])
    questions = tuple(_systemone_question(n, q, assets) for n, q in body["questions"].items())
    if assets.used != set(assets.urls):
        raise ApiError(
            "invalid_request", "assets: every image asset must be referenced", param="assets"
        )
    content: str | list[dict] = (
        [{"type": "text", "text": state}, *state_images] if state_images else state
    )
    return DecisionRequest(({"role": "user", "content": content},), questions)


def _systemone_question(name: str, q: Mapping[str, Any], assets: _Assets) -> Question:
    at = f"questions.{name}"
    text = _as_text(q.get("instructions"), f"{at}.instructions")
    criteria = q.get("criteria")
    images = tuple(assets.images_in(q.get("instructions")) + assets.images_in(criteria))
    if q["type"] == "noul":
        given = criteria or {}
        described = [
            _as_text(given[key], f"{at}.criteria.{key}") if key in given else default.description
            for key, default in zip(("false", "true"), _predicate_options(), strict=True)
        ]
        return Question("predicate", name, text, _predicate_options(*described), images)
    if q["type"] == "choice":
        options = tuple(
            Option(key, compact_json(key), _as_text(desc, f"{at}.criteria.{key}"))
            for key, desc in q["criteria"].items()  # required for a choice
        )
        return Question("choice", name, text, options, images)
    levels = tuple(
        Option(j, _as_text(level, f"{at}.criteria.{j}") or str(j), "", level)
        for j, level in enumerate(q["criteria"])  # required for a score
    )
    return Question("score", name, text, levels, images)


def answer_texts(question: Question) -> list[str]:
    """Each option as the model should write it: its JSON value (a score level's
    JSON-quoted label), so the string "true" and the boolean true differ."""
    if question.kind == "score":
        return [compact_json(o.label) for o in question.options]
    return [compact_json(o.value) for o in question.options]


def question_messages(request: DecisionRequest, question: Question) -> list[dict]:
    """One user turn: the request's content, then the question and its menu.

    Everything goes in a single turn (templates that enforce alternating roles
    accept it); media keep their order. Text-only content becomes one string.
    """
    ordered = question.kind == "score"
    menu = "\n".join(
        text + (f" — {o.description}" if o.description else "")
        for text, o in zip(answer_texts(question), question.options, strict=True)
    )
    ask = (
        f"Consider the input above.\nQuestion: {question.instructions}\n"
        f"Possible answers{' (from lowest to highest)' if ordered else ''}:\n{menu}\n"
        "Reply with exactly one of the JSON values listed, and nothing else."
    )
    parts: list[dict] = []
    for i, message in enumerate(request.input):
        if i:
            parts.append({"type": "text", "text": "\n\n"})
        content = message["content"]
        parts.extend([{"type": "text", "text": content}] if isinstance(content, str) else content)
    parts += [{"type": "text", "text": f"\n\n{ask}"}, *question.images]
    if all(p["type"] == "text" for p in parts):
        return [{"role": "user", "content": "".join(p["text"] for p in parts)}]
    return [{"role": "user", "content": parts}]


def _winner(probabilities: Sequence[float]) -> int:
    """Index of the largest probability (the first one on ties)."""
    return max(range(len(probabilities)), key=lambda i: (probabilities[i], -i))


def confidence(probabilities: Sequence[float], ordered: bool) -> float:
    """The reference's distribution-derived confidence (no learned calibration).

    Unordered (choices): ``(n * p_best - 1) / (n - 1)``, 0 for a uniform and 1
    for a one-hot distribution. Ordered (score levels): ``1 - spread / U``
    with ``spread = sum_i p_i |i - best|`` and ``U = mean_i |i - (n-1)/2|``.
    Both clamped to ``[0, 1]``; a single option is 1.

    Args:
        probabilities (Sequence[float]): sums to 1.
        ordered (bool): the options are ordered levels.

    Returns:
        float: in ``[0, 1]``.
    """
    n, best = len(probabilities), _winner(probabilities)
    if n == 1:
        return 1.0
    if not ordered:
        raw = (probabilities[best] * n - 1) / (n - 1)
    else:
        spread = sum(p * abs(i - best) for i, p in enumerate(probabilities))
        uniform = sum(abs(i - (n - 1) / 2) / n for i in range(n))
        raw = 1 - spread / uniform
    return min(1.0, max(0.0, raw))


def render_answer(question: Question, probabilities: Sequence[float], systemone: bool) -> dict:
    """The answer object for one question, in the OpenAI or System One shape."""
    options, probs = question.options, list(probabilities)
    if question.kind == "predicate":
        if systemone:
            return {"type": "noul", "noul": probs[1]}
        return {"type": "predicate", "name": question.name, "probability": probs[1]}
    conf = confidence(probs, question.kind == "score")
    if question.kind == "choice":
        choice = options[_winner(probs)].value
        if systemone:
            table = {str(o.value): p for o, p in zip(options, probs, strict=True)}
            return {"type": "choice", "choice": choice, "confidence": conf, "probabilities": table}
        rows = [{"value": o.value, "probability": p} for o, p in zip(options, probs, strict=True)]
        return {
            "type": "choice",
            "name": question.name,
            "choice": choice,
            "confidence": conf,
            "probabilities": rows,
        }
    score = sum(i * p for i, p in enumerate(probs))
    if systemone:
        return {
            "type": "score",
            "score": score,
            "confidence": conf,
            "legend": {str(i): o.legend for i, o in enumerate(options)},
            "probabilities": {str(i): p for i, p in enumerate(probs)},
        }
    rows = [
        {"value": i, "label": o.label, "probability": p}
        for i, (o, p) in enumerate(zip(options, probs, strict=True))
    ]
    return {
        "type": "score",
        "name": question.name,
        "score": score,
        "confidence": conf,
        "probabilities": rows,
    }

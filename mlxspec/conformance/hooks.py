"""schemathesis hooks for fuzzing mlxspec: keep generation requests cheap.

Loaded by the schemathesis CLI through ``SCHEMATHESIS_HOOKS=mlxspec.conformance.hooks``
(see :mod:`mlxspec.conformance.fuzz`). The OpenAPI document is never weakened: a
``before_call`` hook edits each generation request just before it is sent, so the
case schemathesis reports is the request the server actually saw.

On a 2-core CPU box the embedded model runs about 5-10 tokens/s, and a prompt
token costs about as much as a generated one (measured: a 32-token forward
pass takes ~25x a 1-token one, quantized or not). An omitted or null
``max_tokens`` means "until EOS or the 8192-token context", so an uncapped case
could run for minutes. Hence both the completion and the prompt text are capped.
"""

from __future__ import annotations

import os
import re
from typing import Any

#: Most tokens a fuzzed generation may produce.
MAX_TOKENS_CAP = 4
#: Characters of prompt text kept per fuzzed request (prompt or all message text).
PROMPT_CHAR_BUDGET = 200
#: Most messages kept in a fuzzed chat request.
MAX_MESSAGES = 4
#: Most choices (``n``) a fuzzed generation may ask for; each is a generation.
MAX_CHOICES = 2
#: Routes that run the model.
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
#: Routes that run forward passes without generating (scoring, embeddings).
FORWARD_PATHS = frozenset({"/v1/decisions", "/v1/systemone", "/v1/embeddings"})
#: Characters kept of each string in a scoring/embedding request.
FORWARD_STRING_CAP = 64
#: Entries kept of each list or name->value map there (questions: 2).
FORWARD_ENTRY_CAP = 4
#: Keys whose values are name -> value maps (System One); other objects keep every key.
_MAP_KEYS = frozenset({"questions", "criteria", "assets"})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def cap_max_tokens(body: Any, cap: int = MAX_TOKENS_CAP) -> Any:
    """Bound the tokens a generation request may produce, keeping its validity.

    The effective limit is ``max_completion_tokens`` when non-null, else
    ``max_tokens`` (the server's precedence). A valid integer above ``cap``
    becomes ``cap``; invalid values (``0``, ``2.5``, ``"x"``, ``True``) are kept,
    since the server must reject them anyway. With no limit at all, ``cap`` is
    set on ``max_tokens`` (or on ``max_completion_tokens`` when ``max_tokens``
    is an explicit null, so that null is still sent).

    Args:
        body (Any): a generated request body; non-objects are returned as is.
        cap (int): the token cap. Default: :data:`MAX_TOKENS_CAP`.

    Returns:
        Any: a new dict (or ``body`` itself when it is not a dict).
    """
    if not isinstance(body, dict):
        return body
    out = dict(body)
    for name in ("max_completion_tokens", "max_tokens"):
        value = out.get(name)
        if value is None:
            continue
        if _is_int(value) and value > cap:
            out[name] = cap
        return out
    out["max_tokens" if "max_tokens" not in out else "max_completion_tokens"] = cap
    return out


def trim_prompt(
    body: Any, budget: int = PROMPT_CHAR_BUDGET, max_messages: int = MAX_MESSAGES
) -> Any:
    """Shorten long prompts: a completion ``prompt`` (text or token ids), and the
    message list and the text of message ``content`` (strings and ``text``
    parts) of a chat.

    Prefill costs about as much per token as decoding on CPU, so the text of a
    whole request shares one character budget. Only values of the right type
    are touched, and a non-empty string or list never becomes empty (their
    schemas' minimums), so validity is kept.

    Args:
        body (Any): a generated request body; non-objects are returned as is.
        budget (int): characters of prompt text kept. Default: :data:`PROMPT_CHAR_BUDGET`.
        max_messages (int): most messages kept. Default: :data:`MAX_MESSAGES`.

    Returns:
        Any: a new dict (or ``body`` itself when it is not a dict).
    """
    if not isinstance(body, dict):
        return body
    out = dict(body)
    if "prompt" in out:
        out["prompt"] = _trim_prompt_value(out["prompt"], max(budget, 1))
    messages = out.get("messages")
    if isinstance(messages, list):
        left = [budget]
        out["messages"] = [_trim_message(m, left) for m in messages[:max_messages]]
    return out


def _trim_prompt_value(prompt: Any, keep: int) -> Any:
    """A completion ``prompt`` cut to ``keep`` characters or token ids: a
    string, a token-id list, or a one-element list holding either; a list of
    several prompts is a 400 however long, so the outer list is kept whole."""
    if isinstance(prompt, str) or (
        isinstance(prompt, list) and all(type(t) is int for t in prompt)
    ):
        return prompt[:keep]
    if isinstance(prompt, list) and len(prompt) == 1:
        return [_trim_prompt_value(prompt[0], keep)]
    return prompt


def _trim_text(text: str, left: list[int]) -> str:
    keep = max(left[0], 0)
    left[0] -= len(text)
    return text if len(text) <= keep else text[: max(keep, 1 if text else 0)]


def _trim_message(message: Any, left: list[int]) -> Any:
    """Trim one message's ``content`` against the shared budget ``left[0]``."""
    if not isinstance(message, dict):
        return message
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": _trim_text(content, left)}
    if isinstance(content, list):
        parts = [
            {**p, "text": _trim_text(p["text"], left)}
            if isinstance(p, dict) and isinstance(p.get("text"), str)
            else p
            for p in content
        ]
        return {**message, "content": parts}
    return message


def cap_choices(body: Any, cap: int = MAX_CHOICES) -> Any:
    """Bound ``n`` (choices are generated one engine request each): a valid
    integer above ``cap`` becomes ``cap``; anything else is kept, since the
    server must judge it.

    Returns:
        Any: a new dict when ``n`` was lowered, else ``body`` itself.
    """
    if isinstance(body, dict) and _is_int(body.get("n")) and body["n"] > cap:
        return {**body, "n": cap}
    return body


def cheap_generation_body(body: Any) -> Any:
    """:func:`cap_max_tokens`, :func:`cap_choices`, then :func:`trim_prompt`."""
    return trim_prompt(cap_choices(cap_max_tokens(body)))


def cheap_forward_body(body: Any) -> Any:
    """Bound the forward passes of a decision or embedding request.

    Every question (2 kept) scores every answer (4 kept per list or map) with
    its own prompt, so counts multiply; strings are cut to
    :data:`FORWARD_STRING_CAP` characters (``data_base64`` excepted, whose
    pattern a cut would break). Kept counts never drop below the schemas'
    minimums (at most 2), and objects keep all their keys, so validity is kept.

    Args:
        body (Any): a generated request body; non-objects are returned as is.

    Returns:
        Any: a new dict (or ``body`` itself when it is not a dict).
    """
    if not isinstance(body, dict):
        return body
    return {key: _shrink(value, key) for key, value in body.items()}


def _shrink(value: Any, key: str | None) -> Any:
    limit = 2 if key == "questions" else FORWARD_ENTRY_CAP
    if isinstance(value, str):
        return value if key == "data_base64" else value[:FORWARD_STRING_CAP]
    if isinstance(value, list):
        return [_shrink(item, None) for item in value[:limit]]
    if isinstance(value, dict):
        items = list(value.items())[:limit] if key in _MAP_KEYS else value.items()
        return {k: _shrink(v, None if key in _MAP_KEYS else k) for k, v in items}
    return value


_SENDABLE_HEADER = re.compile(r"^\S[^\r\n]*$|^$")


def sendable_headers(headers: dict[str, Any] | None) -> bool:
    """Whether the HTTP client (requests) will send every generated header value.

    schemathesis can draw a value starting with a character Python counts as
    whitespace but its own header filter lets through (``"\x85..."``, NEL);
    requests then refuses to send the case and the run reports a "Network
    Error" that never reached the server. Same rule as
    ``requests.utils.check_header_validity``, plus what ``http.client`` can put
    on the wire: a value it cannot encode as latin-1 (``"\U0004182d"``) fails
    the same way, as a client-side "Runtime Error".

    Args:
        headers (dict | None): generated header values.

    Returns:
        bool: ``True`` to keep the case.
    """
    return all(
        not isinstance(v, str) or (_SENDABLE_HEADER.match(v) and _latin1(v))
        for v in (headers or {}).values()
    )


def _latin1(value: str) -> bool:
    """Whether ``http.client`` can encode a header value (it sends latin-1)."""
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def register() -> None:
    """Register the ``before_call`` and ``filter_headers`` hooks with schemathesis
    (global scope).

    Runs on import only when this module is the one ``SCHEMATHESIS_HOOKS``
    names, so importing the helpers above (e.g. in unit tests) registers nothing.
    """
    import schemathesis

    @schemathesis.hook
    def filter_headers(context: Any, headers: dict[str, Any] | None) -> bool:
        """Drop cases whose headers the client could not send (:func:`sendable_headers`)."""
        return sendable_headers(headers)

    @schemathesis.hook
    def before_call(context: Any, case: Any, kwargs: dict[str, Any]) -> None:
        """Make every generation and forward request cheap before it goes on the wire."""
        if case.method.upper() != "POST":
            return
        if case.operation.path in GENERATION_PATHS:
            cheap = cheap_generation_body(case.body)
        elif case.operation.path in FORWARD_PATHS:
            cheap = cheap_forward_body(case.body)
        else:
            return
        if cheap is not case.body and cheap != case.body:
            case.body = cheap


if os.environ.get("SCHEMATHESIS_HOOKS") == __name__:
    register()

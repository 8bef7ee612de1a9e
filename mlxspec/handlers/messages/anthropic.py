"""Anthropic Messages request -> OpenAI chat body: the pure translation.

:func:`to_chat_body` is the one function that turns a validated ``/v1/messages``
(or ``/v1/messages/count_tokens``) body into the OpenAI-shaped chat body that
:func:`mlxspec.handlers.turns.turns.open_turn` takes, so Anthropic requests share the
chat path's templating, tool parsing and sampling. The document has already
checked shapes (roles, block fields, image sources, no audio blocks); this only
maps names and structure (Anthropic's "Messages" API reference for the fields).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mlxspec.errors import ApiError
from mlxspec.handlers.messages.tool_changes import offered_tools
from mlxspec.handlers.requests import ADAPTER_FIELDS, SAMPLER_FIELDS, SESSION_FIELDS

#: Fields copied unchanged: Anthropic's sampling fields, mlx-lm's extras (no
#: ``logit_bias``: the protocol has none), the prompt-cache session labels and
#: the adapter selection.
PASSTHROUGH = ("max_tokens", *SAMPLER_FIELDS, *SESSION_FIELDS, *ADAPTER_FIELDS)

#: Prior-turn reasoning the client sends back; a template must not see it again.
_DROPPED_BLOCKS = {"thinking", "redacted_thinking"}

#: What follows ``messages.<i>.content`` in the refusal of an empty turn (the
#: document's ``AnthropicMessageParam`` says the same of an empty user turn).
EMPTY_TURN = "is empty: every message needs content except a final assistant message (a prefill)"


def to_chat_body(body: Mapping[str, Any]) -> dict[str, Any]:
    """Translate an Anthropic Messages body into an OpenAI chat completion body.

    ``system`` becomes a leading system message, and a ``system`` turn in
    ``messages`` (the ``mid-conversation-system`` beta) a system message where it
    stands; ``tool_use`` blocks become the
    assistant's ``tool_calls`` (``input`` as JSON text); ``tool_result`` blocks
    become ``tool`` messages placed before the rest of their user turn (Anthropic
    requires them first); ``image`` blocks stay ``image`` parts, which a
    text-only model answers with a 400 naming it and the block type;
    ``thinking`` blocks are dropped. Tools without both ``name`` and
    ``input_schema`` (server tools) are dropped, and the betas' tool changes
    (deferred tools, ``tool_addition``/``tool_removal``) are applied by
    :func:`~.tool_changes.offered_tools`; ``tool_choice`` maps ``auto`` ->
    ``"auto"``, ``any`` -> ``"required"``, ``tool`` -> the named function,
    ``none`` -> ``"none"``, and ``disable_parallel_tool_use`` ->
    ``parallel_tool_calls: false``; ``thinking`` sets the template variable
    ``enable_thinking``; ``stop_sequences`` become ``stop``. A final
    ``assistant`` turn without ``tool_use`` is a prefill: the template variable
    ``continue_final_message`` leaves it open, so the reply continues its text
    (Anthropic's "Prefill Claude's response"). ``output_config.format`` (or the
    beta top-level ``output_format``) becomes a ``json_schema``
    ``response_format`` (Anthropic's "Structured outputs").

    Args:
        body (Mapping): a request body validated against ``CreateMessageRequest``
            or ``CountMessageTokensRequest``.

    Returns:
        dict: a new chat body; ``body`` is not mutated.

    Raises:
        ApiError: no user or assistant turn; an empty turn before the last
            (:func:`check_empty_turns`); tool
            results and tool uses that do not pair up (:func:`check_tool_pairs`);
            a thinking budget not below ``max_tokens`` (:func:`check_thinking_budget`);
            a prefill with structured output (the Anthropic SDK documents the two
            as incompatible).
    """
    if all(m["role"] == "system" for m in body["messages"]):
        raise ApiError(
            "invalid_request",
            "messages holds only system turns: send at least one user message to answer",
        )
    check_empty_turns(body["messages"])
    check_thinking_budget(body)
    check_tool_pairs(body["messages"])
    messages = _system(body.get("system"))
    for i, message in enumerate(body["messages"]):
        if message["role"] == "system":
            messages.extend(_system_turn(message, body["messages"][i + 1 :]))
        else:
            messages.extend(_turn(message))
    chat: dict[str, Any] = {"messages": messages}
    chat.update((k, body[k]) for k in PASSTHROUGH if body.get(k) is not None)
    if body.get("stop_sequences"):
        chat["stop"] = list(body["stop_sequences"])
    tools = [_tool(t) for t in offered_tools(body.get("tools") or (), body["messages"])]
    if tools:
        chat["tools"] = tools
    choice = body.get("tool_choice")
    if choice is not None:
        chat["tool_choice"] = _tool_choice(choice)
        if choice.get("disable_parallel_tool_use") is True:
            chat["parallel_tool_calls"] = False
    output = (body.get("output_config") or {}).get("format") or body.get("output_format")
    if output is not None:
        chat["response_format"] = _response_format(output)
    variables: dict[str, Any] = {}
    thinking = body.get("thinking")
    if thinking is not None:
        variables["enable_thinking"] = thinking["type"] != "disabled"
    last = messages[-1] if messages else {}
    if body["messages"][-1]["role"] == "assistant" and not last.get("tool_calls"):
        if output is not None:  # the grammar would start the document over after it
            raise ApiError(
                "invalid_request",
                "a final assistant message (a prefill) cannot be combined with structured "
                "output (output_config.format): the reply must hold the whole JSON document",
            )
        # A trailing assistant turn is a prefill: the reply continues it.
        variables["continue_final_message"] = True
    if variables:
        chat["chat_template_kwargs"] = variables
    return chat


def check_empty_turns(messages: Sequence[Mapping[str, Any]]) -> None:
    """Only the last message may have empty ``content`` (``""``, ``[]``, or
    only text blocks whose ``text`` is ``""``), and only an assistant one.

    Anthropic's Messages API refuses an empty turn anywhere but a final
    assistant one (an empty prefill). The document already refuses a user turn
    of ``""`` or ``[]``; an empty assistant turn is only wrong where another
    follows it, which a schema of one message cannot see, and a turn of empty
    text blocks is empty too.

    Args:
        messages (Sequence[Mapping]): the request's ``messages``, validated.

    Raises:
        ApiError: 400 ``invalid_request`` naming the first empty turn's
            ``messages.<i>.content``.
    """
    last = len(messages) - 1
    for i, message in enumerate(messages):
        if "content" not in message:  # a system turn of output_config only
            continue
        if (i < last or message["role"] != "assistant") and _empty(message["content"]):
            raise ApiError("invalid_request", f"messages.{i}.content {EMPTY_TURN}")


def _empty(content: str | Sequence[Mapping[str, Any]]) -> bool:
    """``content`` says nothing: ``""``, ``[]`` or only empty text blocks."""
    if isinstance(content, str):
        return not content
    return all(block.get("type") == "text" and not block.get("text") for block in content)


def check_thinking_budget(body: Mapping[str, Any]) -> None:
    """An ``enabled`` thinking budget is less than ``max_tokens``.

    Anthropic's API reference (``ThinkingConfigEnabled.budget_tokens``: "Must
    be >=1024 and less than ``max_tokens``"); the document checks the 1024. A
    body without ``max_tokens`` (``countMessageTokens``) has nothing to compare.

    Args:
        body (Mapping): a validated ``createMessage`` or ``countMessageTokens`` body.

    Raises:
        ApiError: 400 ``invalid_request`` naming both values.
    """
    thinking, cap = body.get("thinking") or {}, body.get("max_tokens")
    budget = thinking.get("budget_tokens")
    if thinking.get("type") == "enabled" and budget is not None and cap is not None:
        if budget >= cap:
            raise ApiError(
                "invalid_request",
                f"thinking.budget_tokens ({budget}) must be less than max_tokens ({cap}): "
                "the thinking budget is part of max_tokens",
            )


def check_tool_pairs(messages: Sequence[Mapping[str, Any]]) -> None:
    """Tool results answer the tool uses of the turn just before them, all of them,
    before anything else in their turn.

    Anthropic's Messages API refuses a ``tool_result`` whose ``tool_use_id`` is
    not a ``tool_use`` of the previous (assistant) message, and an assistant
    message whose ``tool_use`` blocks the next message does not all answer
    ("Tool use": results come in the user turn right after the call), so
    results split over two user turns are refused (``system`` turns between
    them are passed over); it also refuses text (or
    any block) before the results ("Parallel tool use": every ``tool_result``
    before any text; its error reads that the message must begin with the
    results). A conversation may end on an assistant ``tool_use`` (nothing
    answers it yet).

    Args:
        messages (Sequence[Mapping]): the request's ``messages``, validated.

    Raises:
        ApiError: 400 ``invalid_request`` naming the message (and block) by
            its dotted path, as Anthropic's errors do.
    """
    # System turns (a beta) stand between turns without breaking a call from its results.
    turns = [(i, m) for i, m in enumerate(messages) if m["role"] != "system"]
    for k, (i, message) in enumerate(turns):
        _check_unique(message, i)
        _check_results_first(message, i)
        answered = _block_ids(message, "tool_result", "tool_use_id")
        if answered:
            before = turns[k - 1][1] if k else None
            previous = before if before is not None and before["role"] == "assistant" else None
            called = _block_ids(previous, "tool_use", "id") if previous else {}
            for use_id, j in answered.items():
                if use_id not in called:
                    raise ApiError(
                        "invalid_request",
                        f"messages.{i}.content.{j}: tool_result for tool_use_id "
                        f"{json.dumps(use_id, ensure_ascii=False)}, "
                        "which no tool_use block of the previous (assistant) message has",
                    )
        if message["role"] == "assistant" and k + 1 < len(turns):
            replies = _block_ids(turns[k + 1][1], "tool_result", "tool_use_id")
            missing = [u for u in _block_ids(message, "tool_use", "id") if u not in replies]
            if missing:
                ids = ", ".join(json.dumps(u, ensure_ascii=False) for u in missing)
                raise ApiError(
                    "invalid_request",
                    f"messages.{i}: tool_use ids without a tool_result block in the next "
                    f"message: {ids} (the results of all of a message's tool_use blocks go "
                    "in the one user message right after it)",
                )


def _check_unique(message: Mapping[str, Any], i: int) -> None:
    """A message names each tool call once: one ``tool_use`` per id, one
    ``tool_result`` per ``tool_use_id`` (a second answer, or two calls under
    one id, could not be told apart)."""
    content = message["content"]
    if isinstance(content, str):
        return
    for kind, key in (("tool_use", "id"), ("tool_result", "tool_use_id")):
        seen: set[str] = set()
        for j, block in enumerate(content):
            if block["type"] != kind:
                continue
            if block[key] in seen:
                raise ApiError(
                    "invalid_request",
                    f"messages.{i}.content.{j}: a second {kind} block with {key} "
                    f"{json.dumps(block[key], ensure_ascii=False)}; each must be unique",
                )
            seen.add(block[key])


def _check_results_first(message: Mapping[str, Any], i: int) -> None:
    """A message's ``tool_result`` blocks come before its other blocks."""
    content = message["content"]
    if isinstance(content, str):
        return
    first_other: int | None = None
    for j, block in enumerate(content):
        if block["type"] != "tool_result":
            first_other = j if first_other is None else first_other
        elif first_other is not None:
            raise ApiError(
                "invalid_request",
                f"messages.{i}.content.{j}: tool_result blocks must come first in their "
                f"message, before any other content (messages.{i}.content.{first_other} is "
                f"of type {json.dumps(content[first_other]['type'], ensure_ascii=False)})",
            )


def _block_ids(message: Mapping[str, Any], kind: str, key: str) -> dict[str, int]:
    """``{id: block index}`` of ``message``'s blocks of type ``kind``, in order."""
    content = message["content"]
    if isinstance(content, str):
        return {}
    return {block[key]: j for j, block in enumerate(content) if block["type"] == kind}


def _response_format(output: Mapping[str, Any]) -> dict[str, Any]:
    """Chat's ``response_format`` for an Anthropic ``output_config.format``."""
    spec: dict[str, Any] = {"name": "output", "schema": output["schema"]}
    if output.get("any_whitespace") is not None:
        spec["any_whitespace"] = output["any_whitespace"]
    return {"type": "json_schema", "json_schema": spec}


def _system(system: str | list[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    if not system:
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    return [{"role": "system", "content": [_text_part(b["text"]) for b in system]}]


def _system_turn(
    message: Mapping[str, Any], after: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """A ``system`` turn in ``messages`` as a system message where it stands: its
    text blocks (tool changes are read by :func:`offered_tools`); none when it
    has no text, or ``clear_at: "next_user_message"`` and a user turn follows
    (the beta's rule: it is shown only for the user turn it follows)."""
    content = message.get("content") or ""
    if message.get("clear_at") == "next_user_message" and any(m["role"] == "user" for m in after):
        return []
    if not isinstance(content, str):
        content = "".join(b["text"] for b in content if b["type"] == "text")
    return [{"role": "system", "content": content}] if content else []


def _turn(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One Anthropic turn as OpenAI messages (a user turn with tool results
    becomes ``tool`` messages, then a user message with what remains)."""
    role, content = message["role"], message["content"]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    parts: list[dict[str, Any]] = []
    tool_calls: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    for block in content:
        kind = block["type"]
        if kind in _DROPPED_BLOCKS:
            continue
        if kind == "tool_use":
            tool_calls.append(_tool_call(block))
        elif kind == "tool_result":
            results.append(_tool_message(block))
        else:
            parts.append(_part(block))
    if role == "assistant":
        if not parts and not tool_calls:
            return [{"role": "assistant", "content": ""}]
        reply: dict[str, Any] = {"role": "assistant", "content": parts or None}
        if tool_calls:
            reply["tool_calls"] = tool_calls
        return [reply]
    if parts or not results:
        results.append({"role": "user", "content": parts})
    return results


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _part(block: Mapping[str, Any]) -> dict[str, Any]:
    """A content block as an OpenAI content part. Other blocks (``image``,
    ``document``) pass through unchanged, so the prompt builder rejects them
    under the name the client sent (no model served here reads images)."""
    if block["type"] == "text":
        return _text_part(block["text"])
    return dict(block)


def _tool_call(block: Mapping[str, Any]) -> dict[str, Any]:
    arguments = json.dumps(block["input"], ensure_ascii=False)
    return {
        "id": block["id"],
        "type": "function",
        "function": {"name": block["name"], "arguments": arguments},
    }


def _result_part(block: Mapping[str, Any]) -> dict[str, Any]:
    """A tool result's block as a content part; a ``tool_reference`` (the tool it
    loads is now among the tools) becomes a line of text naming it."""
    if block.get("type") == "tool_reference":
        return _text_part(f"Tool loaded: {block.get('tool_name')}")
    return _part(block)


def _tool_message(block: Mapping[str, Any]) -> dict[str, Any]:
    """A ``tool_result`` as a ``tool`` message; ``is_error: true`` rides along
    for the prompt builder to show the failure
    (:func:`mlxspec.engine.prompt_messages.mark_tool_errors`)."""
    content = block.get("content")
    if content is None:
        content = ""
    elif not isinstance(content, str):
        content = [_result_part(b) for b in content]
    message = {"role": "tool", "tool_call_id": block["tool_use_id"], "content": content}
    if block.get("is_error") is True:
        message["is_error"] = True
    return message


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool["name"], "parameters": tool["input_schema"]}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Mapping[str, Any]) -> Any:
    kind = choice["type"]
    if kind == "tool":
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}[kind]

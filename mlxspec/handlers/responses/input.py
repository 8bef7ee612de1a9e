"""OpenAI Responses request -> OpenAI chat body (pure).

:func:`to_chat_body` is the one translation the Responses surface makes
before the shared chat path (:func:`mlxspec.handlers.turns.turns.open_turn`): input
items become chat messages, ``instructions`` and ``system``/``developer``
items merge into one leading system message, flat function tools become chat
tools, and a stored conversation named by ``previous_response_id`` is spliced
in front (reference, "POST /v1/responses"). The document has validated the
body already; nothing here re-checks types.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mlxspec.errors import ApiError
from mlxspec.handlers.requests import ADAPTER_FIELDS, SAMPLER_FIELDS, SESSION_FIELDS
from mlxspec.handlers.responses.store import Conversation

#: Fields carried to the chat body as they are: the sampler and penalty
#: extensions, stop strings, the parser switches, the cache-session labels and
#: the adapter selection.
CARRIED_FIELDS = (
    *SAMPLER_FIELDS,
    "logit_bias",
    "stop",
    "parallel_tool_calls",
    "chat_template_kwargs",
    *SESSION_FIELDS,
    *ADAPTER_FIELDS,
)

#: Content part types that carry text, and the key holding it.
_TEXT_PARTS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


def to_chat_body(
    body: Mapping[str, Any], previous: Conversation | None = None
) -> tuple[dict[str, Any], Conversation]:
    """Translate a validated Responses request into an OpenAI chat body.

    Args:
        body (Mapping): the ``POST /v1/responses`` body.
        previous (Conversation | None): the stored conversation of
            ``previous_response_id``, already looked up. Default: ``None``.

    Returns:
        tuple[dict, Conversation]: the chat body for ``open_turn``, and the
        conversation so far (the previous one plus this input) that the
        response's output will extend when it is stored.

    Rules: ``instructions`` replace the previous response's only when given;
    ``max_output_tokens`` wins over ``max_completion_tokens``, then ``max_tokens``;
    non-function tools (web_search, file_search, mcp, computer_use, ...) are dropped;
    ``text.format`` becomes ``response_format`` (structured output).
    """
    previous = previous or Conversation()
    system, messages = input_messages(body.get("input"))
    instructions = body.get("instructions")
    conversation = Conversation(
        instructions=previous.instructions if instructions is None else instructions,
        system=previous.system + tuple(system),
        messages=previous.messages + tuple(messages),
    )
    check_call_outputs(conversation.messages)
    chat: dict[str, Any] = {k: body[k] for k in CARRIED_FIELDS if body.get(k) is not None}
    chat["messages"] = chat_messages(conversation)
    max_tokens = next(
        (
            body[k]
            for k in ("max_output_tokens", "max_completion_tokens", "max_tokens")
            if body.get(k) is not None
        ),
        None,
    )
    if max_tokens is not None:
        chat["max_tokens"] = max_tokens
    tools = function_tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = chat_tool_choice(body["tool_choice"])
    response_format = chat_response_format((body.get("text") or {}).get("format"))
    if response_format is not None:
        chat["response_format"] = response_format
    return chat, conversation


def check_call_outputs(messages: Sequence[Mapping[str, Any]]) -> None:
    """Every ``function_call_output`` answers a call made before it, in this
    input or in the stored conversation (OpenAI's Responses API refuses an
    output for an unknown ``call_id``; replying to it would show the model a
    result of a call it never made).

    Args:
        messages (Sequence[Mapping]): the conversation's chat messages, in order.

    Raises:
        ApiError: 400 ``invalid_request`` naming the ``call_id``, ``param: input``.
    """
    called: set[str] = set()
    for message in messages:
        called.update(call["id"] for call in message.get("tool_calls") or ())
        if message["role"] == "tool" and message["tool_call_id"] not in called:
            raise ApiError(
                "invalid_request",
                "No tool call found for function call output with call_id "
                f"{message['tool_call_id']}.",
                param="input",
            )


def chat_messages(conversation: Conversation) -> list[dict[str, Any]]:
    """The conversation as chat messages: one leading system message (the
    instructions, then each system text, blank-line separated) when there is any."""
    texts = [t for t in (conversation.instructions, *conversation.system) if t]
    head = [{"role": "system", "content": "\n\n".join(texts)}] if texts else []
    return head + [dict(m) for m in conversation.messages]


def input_messages(items: str | Sequence[Mapping[str, Any]] | None) -> tuple[list[str], list[dict]]:
    """Split ``input`` into system texts and chat messages.

    A string is one user message. ``message`` items (``type`` may be omitted)
    keep their role, except ``system``/``developer`` whose text is returned
    separately; ``function_call`` items become assistant ``tool_calls``
    (joined onto the assistant turn right before them, so parallel calls stay
    one turn); ``function_call_output`` items become ``tool`` messages;
    ``reasoning`` items are dropped (earlier thinking is not replayed).

    Returns:
        tuple[list[str], list[dict]]: system texts, then chat messages.
    """
    if items is None:
        return [], []
    if isinstance(items, str):
        return [], [{"role": "user", "content": items}]
    system: list[str] = []
    messages: list[dict[str, Any]] = []
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            if item["role"] in ("system", "developer"):
                system.append(content_text(item.get("content")))
            else:
                messages.append(
                    {"role": item["role"], "content": chat_content(item.get("content"))}
                )
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item.get("arguments", "")},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            text = output if isinstance(output, str) else content_text(output)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
    return system, messages


def chat_content(content: str | Sequence[Mapping[str, Any]] | None) -> Any:
    """Responses content (a string or input parts) as chat content.

    Text parts (``input_text``, ``output_text``, ``refusal``) become ``text``
    parts; ``input_image`` becomes ``image_url``, so the model's own media
    check answers it; other parts keep their type (and are refused there).
    """
    if content is None or isinstance(content, str):
        return content
    parts = []
    for part in content:
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get(_TEXT_PARTS[kind], "")})
        elif kind == "input_image":
            url = part.get("image_url") or part.get("file_id") or ""
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append(dict(part))
    return parts


def content_text(content: str | Sequence[Mapping[str, Any]] | None) -> str:
    """The text of string-or-parts content, its text parts concatenated."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(
        str(p.get(_TEXT_PARTS[p["type"]], "")) for p in content if p.get("type") in _TEXT_PARTS
    )


def function_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """Flat Responses function tools as chat tools; built-in tool types are dropped."""
    out = []
    for tool in tools or ():
        if tool.get("type") != "function":
            continue
        function = {
            k: tool[k]
            for k in ("name", "description", "parameters", "strict")
            if tool.get(k) is not None
        }
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: str | Mapping[str, Any]) -> Any:
    """``"auto"``/``"none"``/``"required"`` as they are; ``{"type": "function",
    "name": n}`` as chat's ``{"type": "function", "function": {"name": n}}``."""
    if isinstance(choice, str):
        return choice
    return {"type": "function", "function": {"name": choice["name"]}}


def chat_response_format(fmt: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Responses ``text.format`` as chat's ``response_format`` (``None`` for plain text).

    ``{"type": "json_schema", "name", "schema", ...}`` nests its fields under
    ``json_schema`` as chat does; ``json_object`` is the same on both.
    """
    kind = (fmt or {}).get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind != "json_schema":
        return None
    assert fmt is not None
    keys = ("name", "description", "schema", "strict", "any_whitespace")
    return {"type": "json_schema", "json_schema": {k: fmt[k] for k in keys if k in fmt}}


def assistant_message(content: str | None, tool_calls: Sequence[Mapping[str, Any]]) -> dict:
    """The chat assistant turn that stores a response's output for replay.

    Args:
        content (str | None): the output text (``None`` when there is none).
        tool_calls (Sequence[Mapping]): ``{"id", "name", "arguments"}`` per call.
    """
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in tool_calls
        ]
    return message

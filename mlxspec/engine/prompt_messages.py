"""Chat messages made template-ready: text parts joined, arguments decoded,
reasoning under the name templates read, failed tool results marked.

Normalisation follows ``mlx_lm.server.process_message_content``: text-part
arrays are joined, ``content: null`` becomes ``""`` and tool-call
``arguments`` given as a JSON string are decoded to an object, because chat
templates render ``arguments | tojson``. Assistant ``reasoning`` is exposed as
``reasoning_content`` (the name Qwen-style templates read) unless that is given,
even empty (reference, chat request body). Media parts on a text-only model are
a :class:`PromptError`, never silently dropped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from mlxspec.engine.tool_prompt import template_renders_tools
from mlxspec.engine.types import PromptError

__all__ = ["TOOL_ERROR_MARKER", "mark_tool_errors", "normalize_messages"]

_MEDIA_PARTS = {"image_url", "image", "input_audio", "audio", "audio_url", "video_url", "video"}


def normalize_messages(messages: Sequence[Mapping[str, Any]], model_id: str) -> list[dict]:
    """Return template-ready copies of OpenAI chat messages.

    Args:
        messages (Sequence[Mapping]): validated request messages.
        model_id (str): served model id, named in media errors.

    Returns:
        list[dict]: new message dicts; the input is not mutated.

    Raises:
        PromptError: a media part (image/audio/video) on this text-only model,
            or a content part without text.
    """
    out = []
    for i, message in enumerate(messages):
        msg = dict(message)
        msg["content"] = _content_text(msg.get("content"), model_id, f"messages[{i}].content")
        if msg.get("tool_calls"):
            msg["tool_calls"] = [_decode_arguments(tc) for tc in msg["tool_calls"]]
        if isinstance(msg.get("reasoning"), str) and not isinstance(
            msg.get("reasoning_content"), str
        ):
            msg["reasoning_content"] = msg["reasoning"]
        out.append(msg)
    return out


def _content_text(content: Any, model_id: str, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind in _MEDIA_PARTS:
            raise PromptError(
                f"model {model_id} is text-only: '{kind}' content parts are not supported",
                param=f"{param}[{j}]",
            )
        if kind != "text" or not isinstance(part.get("text"), str):
            raise PromptError(
                f"unsupported content part type '{kind}': a prompt here holds text (and "
                "images or audio on a model that reads them)",
                param=f"{param}[{j}]",
            )
        pieces.append(part["text"])
    return "".join(pieces)


def _decode_arguments(tool_call: Mapping[str, Any]) -> dict:
    call = dict(tool_call)
    function = dict(call.get("function") or {})
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            function["arguments"] = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # templates that print arguments verbatim still get the string
    call["function"] = function
    return call


#: What a failed tool result's text starts with when the chat template has no
#: field of its own for the failure (an Anthropic ``tool_result`` with
#: ``is_error: true``): the model reads that its call failed.
TOOL_ERROR_MARKER = "Error: "


def mark_tool_errors(messages: list[dict], template: Any) -> list[dict]:
    """``messages`` with each failed tool result (a ``tool`` message with
    ``is_error: true``) shown to the model as a failure.

    A template that reads ``is_error`` itself (and renders tool turns) gets
    the field as it is; for any other, the result's text is prefixed with :data:`TOOL_ERROR_MARKER`
    (``"Error: "``; docs/deviations.md) and the field dropped.

    Args:
        messages (list[dict]): normalized chat messages.
        template: the chat template that renders them (a string, or a
            list/dict of named templates).

    Returns:
        list[dict]: a new list; ``messages`` is not mutated.
    """
    if not any(m.get("role") == "tool" and "is_error" in m for m in messages):
        return messages
    # a template that renders no tools gets results as user text (with_tool_history)
    own_field = "is_error" in str(template) and template_renders_tools(template)
    out = []
    for message in messages:
        if message.get("role") != "tool" or "is_error" not in message:
            out.append(message)
            continue
        failed = message["is_error"] is True
        if own_field:
            out.append(message)
            continue
        message = {k: v for k, v in message.items() if k != "is_error"}
        if failed:
            content = message.get("content") or ""
            if isinstance(content, list):  # parts holding media
                message["content"] = [{"type": "text", "text": TOOL_ERROR_MARKER}, *content]
            else:
                message["content"] = TOOL_ERROR_MARKER + str(content)
        out.append(message)
    return out

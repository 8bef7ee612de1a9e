"""Chat turns: one generation seen as content, reasoning and tool calls.

Every chat-shaped surface (OpenAI chat completions, Anthropic Messages, OpenAI
Responses) is a translation onto this module: the surface builds an
OpenAI-shaped chat body, :func:`open_turn` templates and submits it, and the
surface renders the :data:`ChatEvent` stream (or the collected
:class:`ChatTurn`) in its own wire format. Parsing the model's text into a
thinking channel and tool calls happens here, once, through the parser
registries, so the three surfaces can never disagree about what the model said.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlxspec.engine import Delta, Engine, Finished, GenerationRequest, RequestHandle, TokenLogprob

from .common import (
    cancel_on_disconnect,
    outputs,
    request_headers,
    session_key,
    to_generation_request,
)


@dataclass(frozen=True)
class ToolCall:
    """One complete tool call.

    Args:
        id (str): the call id (``call_<hex>``), echoed by the client's tool result.
        name (str): the function name.
        arguments (str): the arguments as JSON text (an object).
    """

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class TextDelta:
    """Visible answer text, with the logprobs of the tokens it came from."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ReasoningDelta:
    """Thinking-channel text (between the template's think markers)."""

    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ToolCallStart:
    """A tool call begins: its index in the turn (0..k-1), id and function name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    """A fragment of tool call ``index``'s arguments JSON; the fragments of a
    call concatenate to its final ``arguments``."""

    index: int
    fragment: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class TurnEnd:
    """The turn ended.

    Args:
        finish_reason (str): ``"stop"``, ``"length"`` or ``"tool_calls"``.
        finished (Finished): the engine's counts (prompt, completion, cached tokens, lane).
    """

    finish_reason: str
    finished: Finished


ChatEvent = TextDelta | ReasoningDelta | ToolCallStart | ToolCallArguments | TurnEnd


@dataclass(frozen=True)
class TurnOptions:
    """What the parsers need to know about a turn.

    Args:
        tools (tuple[dict, ...]): the request's OpenAI function tools. Default: ``()``.
        tool_choice (Any): ``"auto"``, ``"none"``, ``"required"`` or
            ``{"type": "function", "function": {"name": ...}}``. Default: ``"auto"``.
        parallel_tool_calls (bool): allow more than one call. Default: ``True``.
    """

    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True


@dataclass
class ChatTurn:
    """A whole turn, collected (the non-streamed form of the events)."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str = "stop"
    finished: Finished | None = None


@dataclass
class Turn:
    """A submitted chat turn: the engine request, its handle and the options."""

    request: GenerationRequest
    handle: RequestHandle
    options: TurnOptions


def turn_options(body: Mapping[str, Any]) -> TurnOptions:
    """The parser options of an OpenAI-shaped chat body (pure)."""
    tools = tuple(body.get("tools") or ())
    choice = body.get("tool_choice")
    return TurnOptions(
        tools=tools,
        tool_choice="auto" if choice is None else choice,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
    )


def open_turn(engine: Engine, body: Mapping[str, Any], prompt_param: str = "messages") -> Turn:
    """Template an OpenAI-shaped chat body and submit it to the engine.

    Args:
        engine (Engine): the serving engine.
        body (Mapping): an OpenAI chat completion body (other surfaces translate
            to this shape first); ``messages``, ``tools``, ``chat_template_kwargs``
            and the sampling fields are read.
        prompt_param (str): the request field named in prompt errors.
            Default: ``"messages"``.

    Returns:
        Turn: the submitted request.

    Raises:
        PromptError: the template cannot render the messages.
        ContextLengthError: the prompt does not fit.
    """
    options = turn_options(body)
    tools = list(options.tools) if options.tools and options.tool_choice != "none" else None
    prompt = engine.chat_prompt(body["messages"], tools, body.get("chat_template_kwargs"))
    session = session_key(body, request_headers())
    request = to_generation_request(body, prompt, engine.defaults, engine.info, session)
    handle = engine.submit(request, prompt_param=prompt_param)
    return Turn(request, handle, options)


async def turn_events(turn: Turn) -> AsyncIterator[ChatEvent]:
    """The turn's chat events, in order, ending with one :class:`TurnEnd`.

    Raises:
        ApiError: ``server_error`` or ``cancelled`` from the engine (see ``outputs``).
    """
    async for event in outputs(turn.handle):
        if isinstance(event, Finished):
            yield TurnEnd(event.finish_reason, event)
        elif isinstance(event, Delta) and (event.text or event.logprobs):
            yield TextDelta(event.text, event.logprobs)


async def collect_turn(turn: Turn) -> ChatTurn:
    """Gather a non-streamed turn; a client disconnect cancels the engine request.

    Raises:
        ApiError: ``server_error`` or ``cancelled`` from the engine.
    """
    out = ChatTurn()
    text: list[str] = []
    reasoning: list[str] = []
    names: dict[int, tuple[str, str]] = {}
    arguments: dict[int, list[str]] = {}
    watcher = asyncio.ensure_future(cancel_on_disconnect(turn.handle))
    try:
        async for event in turn_events(turn):
            if isinstance(event, TextDelta):
                text.append(event.text)
                out.logprobs.extend(event.logprobs)
            elif isinstance(event, ReasoningDelta):
                reasoning.append(event.text)
                out.logprobs.extend(event.logprobs)
            elif isinstance(event, ToolCallStart):
                names[event.index] = (event.id, event.name)
                arguments.setdefault(event.index, [])
            elif isinstance(event, ToolCallArguments):
                arguments.setdefault(event.index, []).append(event.fragment)
                out.logprobs.extend(event.logprobs)
            else:
                out.finish_reason, out.finished = event.finish_reason, event.finished
    except asyncio.CancelledError:
        turn.handle.cancel()
        raise
    finally:
        watcher.cancel()
    out.tool_calls = [
        ToolCall(names[i][0], names[i][1], "".join(arguments.get(i, []))) for i in sorted(names)
    ]
    joined = "".join(text)
    out.content = joined if joined or not out.tool_calls else None
    out.reasoning = "".join(reasoning) or None
    return out

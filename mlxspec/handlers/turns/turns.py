"""Chat turns: one generation seen as content, reasoning and tool calls.

Every chat-shaped surface (OpenAI chat completions, Anthropic Messages, OpenAI
Responses) is a translation onto this module: the surface builds an
OpenAI-shaped chat body, :func:`open_turn` templates and submits it, and the
surface renders the :data:`ChatEvent` stream (or the collected
:class:`ChatTurn`) in its own wire format. Parsing the model's text into a
thinking channel and tool calls happens once, in :mod:`.turn_parser`, through
the parser registries, so the three surfaces can never disagree about what the
model said.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from mlxspec.engine import (
    ChatFormat,
    Constraint,
    Delta,
    EngineProtocol,
    Finished,
    GenerationRequest,
    RequestHandle,
    TemplateBudget,
)
from mlxspec.handlers.adapters.select import request_adapters
from mlxspec.handlers.context import request_headers
from mlxspec.handlers.events import cancel_on_disconnect, outputs, submit_choices
from mlxspec.handlers.requests import (
    choice_count,
    choice_requests,
    session_key,
    to_generation_request,
)
from mlxspec.handlers.turns.parser import (
    ChatEvent,
    ChatTurn,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallCut,
    ToolCallStart,
    TurnEnd,
    TurnParser,
)
from mlxspec.handlers.turns.structured import structured_output, warning_header, with_system_note
from mlxspec.handlers.turns.templates import build_prompt, template_budget
from mlxspec.handlers.turns.tool_options import (
    TurnOptions,
    forcing_constraint,
    forcing_instruction,
    template_kwargs,
    turn_options,
)
from mlxspec.parsers import ParserChoice, detect, reasoning_parser_class


@dataclass
class Turn:
    """A submitted chat turn: the engine request, its handle and the options.

    Args:
        choice (ParserChoice): the model's tool-call and reasoning formats.
        thinking (bool): the prompt left the thinking channel open, so the
            output starts inside it.
        warning (dict[str, str]): ``{"Warning": ...}`` when a grammar the turn
            asked for is not enforced (the degrade path), else ``{}``; the
            surface adds it to its response headers.
    """

    request: GenerationRequest
    handle: RequestHandle
    options: TurnOptions
    choice: ParserChoice = ParserChoice()
    thinking: bool = False
    warning: dict[str, str] = field(default_factory=dict)


@functools.lru_cache(maxsize=8)
def _choice(chat_format: ChatFormat) -> ParserChoice:
    """The served model's parser formats, detected once per chat format."""
    return detect(chat_format)


def _opens_thinking(engine: EngineProtocol, prompt: list[int], choice: ParserChoice) -> bool:
    """True when the rendered prompt ends inside an open thinking channel
    (templates that write ``<think>`` into the generation prompt)."""
    if choice.reasoning is None:
        return False
    parser = reasoning_parser_class(choice.reasoning)
    tail = engine.decode_tokens(prompt[-16:])
    return tail.rfind(parser.start) > tail.rfind(parser.end)


async def open_turns(
    engine: EngineProtocol, body: Mapping[str, Any], prompt_param: str = "messages"
) -> list[Turn]:
    """Template an OpenAI-shaped chat body (off the event loop) and submit its
    ``n`` choices, one engine request each, on the one prompt.

    Every grammar the turn would run under is compiled first (off the event
    loop), so one that cannot be enforced takes the degrade path before the
    response starts (reference, "Structured output"): structured output as in
    :func:`~.structured.structured_output`; a forcing ``tool_choice`` whose
    tool-call grammar does not compile (a ``parameters`` schema xgrammar
    rejects, or ``MLXSPEC_GRAMMAR=0``) runs unconstrained, with the forced call
    asked for in a system instruction (:func:`~.tool_options.forcing_instruction`).
    Either way ``Turn.warning`` holds the ``Warning`` header.

    A template the body brings (``chat_template_kwargs.chat_template``, on a
    server that allows it) renders within the server's bounds, counted by
    admission and stopped when the client leaves (:mod:`.templates`).

    Args:
        engine (EngineProtocol): the serving engine.
        body (Mapping): an OpenAI chat completion body (other surfaces translate
            to this shape first); ``messages``, ``tools``, ``chat_template_kwargs``,
            ``n``, the structured-output and the sampling fields are read.
        prompt_param (str): the request field named in prompt errors.
            Default: ``"messages"``.

    Returns:
        list[Turn]: one per choice, in index order; the engine admitted all of
        them or none (:func:`~mlxspec.handlers.events.submit_choices`).

    Raises:
        PromptError: the template cannot render the messages
            (``TemplateBoundError``: a request's template over the bounds).
        ContextLengthError: the prompt does not fit.
        ApiError: an invalid or unenforceable ``tool_choice`` (400).
        AdapterError: an ``adapter`` (or adapter ``model``) that is not mounted (400).
        EngineRequestError, QueueFullError: as ``Engine.submit``.
    """
    adapter = request_adapters(engine, body)  # an unknown id is a 400 before any work
    p = await _prepare(engine, body)
    session = session_key(p.body, request_headers())
    request = to_generation_request(
        p.body, p.prompt, engine.defaults, engine.info, session, adapter
    )
    if p.forced:  # the tool call wins over any structured-output constraint
        request = dataclasses.replace(request, constraint=p.constraint)
    requests = choice_requests(request, choice_count(p.body))
    handles = submit_choices(engine, requests, prompt_param)
    return [
        Turn(request, handle, p.options, p.choice, p.thinking, p.warning)
        for request, handle in zip(requests, handles, strict=True)
    ]


async def open_turn(
    engine: EngineProtocol, body: Mapping[str, Any], prompt_param: str = "messages"
) -> Turn:
    """:func:`open_turns` for a body of one choice (the Messages and Responses
    surfaces translate to a chat body without ``n``)."""
    (turn,) = await open_turns(engine, body, prompt_param)
    return turn


@dataclass
class _Prepared:
    """A chat body made ready to submit: the body that runs (with a degrade
    note, if any), its prompt tokens, and how the turn reads its output."""

    body: dict[str, Any]
    prompt: list[int]
    thinking: bool
    options: TurnOptions
    choice: ParserChoice
    forced: bool
    constraint: Constraint | None
    warning: dict[str, str]


async def _prepare(engine: EngineProtocol, body: Mapping[str, Any]) -> _Prepared:
    """Compile the turn's grammars, take the degrade path where one fails, and
    render the prompt (see :func:`open_turns`)."""
    run, warning = await structured_output(engine, dict(body), chat=True)
    options = turn_options(run)
    choice = _choice(engine.chat_format)
    budget = template_budget(engine, run)
    prompt, thinking = await build_prompt(
        engine, budget, _render, engine, run, options, choice, budget
    )
    forced = bool(options.tools) and options.tool_choice not in ("auto", "none")
    constraint = forcing_constraint(options, choice, thinking) if forced else None
    if constraint is not None:
        reason = await asyncio.to_thread(engine.grammar_problem, constraint)
        if reason is not None:
            run = with_system_note(run, forcing_instruction(options))
            args = (engine, run, options, choice, budget)
            prompt, thinking = await build_prompt(engine, budget, _render, *args)
            constraint, warning = None, warning_header(reason)
    return _Prepared(run, prompt, thinking, options, choice, forced, constraint, warning)


async def count_prompt(engine: EngineProtocol, body: Mapping[str, Any]) -> int:
    """Tokens of the prompt :func:`open_turns` would submit for ``body``: the same
    template, tools, template variables and degrade-path instruction (a grammar
    that does not compile is described in a system message), without generating.

    Raises:
        PromptError: the template cannot render the messages.
        ApiError: an invalid ``tool_choice`` (400), as :func:`open_turns`.
    """
    return len((await _prepare(engine, body)).prompt)


def _render(
    engine: EngineProtocol,
    body: Mapping[str, Any],
    options: TurnOptions,
    choice: ParserChoice,
    budget: TemplateBudget | None,
) -> tuple[list[int], bool]:
    """The prompt tokens of ``body`` and whether they leave the thinking channel
    open (a prompt thread's work: see :func:`.templates.build_prompt`)."""
    tools = list(options.tools) if options.tools and options.tool_choice != "none" else None
    own = engine.request_template(body.get("chat_template_kwargs"))
    template = own if own is not None else engine.chat_format.chat_template
    kwargs = template_kwargs(body, str(template or ""), engine.defaults.template_kwargs)
    prompt = engine.chat_prompt(body["messages"], tools, kwargs, budget)
    return prompt, _opens_thinking(engine, prompt, choice)


async def turn_events(turn: Turn) -> AsyncIterator[ChatEvent]:
    """The turn's chat events, in order, ending with one :class:`TurnEnd`.

    Raises:
        ApiError: ``server_error`` or ``cancelled`` from the engine (see ``outputs``).
    """
    parser = TurnParser(turn.options, turn.choice, turn.thinking)
    # Without a reasoning or tool parser, text passes through as it is: skip
    # the parser's per-token objects (it still handles held-back logprobs).
    plain = parser.reasoning is None and parser.tools is None
    async for event in outputs(turn.handle):
        if isinstance(event, Finished):
            for chat_event in parser.finish(cut=event.finish_reason == "length"):
                yield chat_event
            yield TurnEnd(parser.finish_reason(event.finish_reason), event)
        elif plain and event.text and not parser.pending:
            yield TextDelta(event.text, event.logprobs)
        elif isinstance(event, Delta):
            for chat_event in parser.feed(event.text, event.logprobs):
                yield chat_event


async def collect_turn(turn: Turn) -> ChatTurn:
    """Gather a non-streamed turn; a client disconnect cancels the engine request.

    A call cut off by the token budget (:class:`ToolCallCut`) is left out; its
    markup never becomes content, so ``content`` is ``""`` when no text came
    before it (``None`` only when the turn holds complete tool calls and no text).

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
            elif isinstance(event, ToolCallCut):
                if event.index is not None:
                    names.pop(event.index)
            elif isinstance(event, TurnEnd):
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
    # ``None`` means "only tool calls" (OpenAI); a call the budget cut is no call.
    out.content = joined if joined or not out.tool_calls else None
    out.reasoning = "".join(reasoning) or None
    return out

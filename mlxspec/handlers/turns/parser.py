"""What a chat turn's text means: the events the surfaces render (text,
reasoning, tool calls, the end) and :class:`TurnParser`, which splits the
model's output into them through the reasoning and tool parser registries
(pure and synchronous; :mod:`.turns` feeds it the engine's deltas)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

from mlxspec.engine import Finished, TokenLogprob
from mlxspec.handlers.turns.tool_options import TurnOptions, tool_parser_name
from mlxspec.parsers import (
    CallArguments,
    CallBegin,
    CallEnd,
    Content,
    ParserChoice,
    ParserDelta,
    Reasoning,
    reasoning_parser_class,
    tool_parser_class,
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
class ToolCallCut:
    """The token budget ended the output inside tool-call markup, which is
    dropped. ``index`` is the call it had started (its arguments never
    completed, so it is not a call), or ``None`` when no call had a name yet.
    Collected turns leave the call out; a stream that already sent its start
    and fragments ends with ``length`` and sends nothing made up to close it."""

    index: int | None


@dataclass(frozen=True)
class TurnEnd:
    """The turn ended.

    Args:
        finish_reason (str): ``"stop"``, ``"length"`` or ``"tool_calls"``.
        finished (Finished): the engine's counts (prompt, completion, cached tokens, lane).
    """

    finish_reason: str
    finished: Finished


ChatEvent = TextDelta | ReasoningDelta | ToolCallStart | ToolCallArguments | ToolCallCut | TurnEnd


@dataclass
class ChatTurn:
    """A whole turn, collected (the non-streamed form of the events)."""

    content: str | None = None
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str = "stop"
    finished: Finished | None = None


class TurnParser:
    """Runs the reasoning and tool parsers over a turn's text (pure, synchronous).

    Reasoning is split off first, then the content goes through the tool
    parser. Token logprobs ride the next event that can carry them, so withheld
    markup tokens keep their entries and their order.

    Args:
        options (TurnOptions): tools, ``tool_choice`` and ``parallel_tool_calls``.
        choice (ParserChoice): the model's formats.
        thinking (bool): the output starts inside the thinking channel. Default: ``False``.
    """

    def __init__(self, options: TurnOptions, choice: ParserChoice, thinking: bool = False):
        self.reasoning = (
            reasoning_parser_class(choice.reasoning)(thinking) if choice.reasoning else None
        )
        name = tool_parser_name(options, choice)
        self.tools = tool_parser_class(name)(options.tools) if name else None
        self.parallel = options.parallel_tool_calls
        self.calls = 0
        self.dropping = False
        #: Index of the call whose arguments are still being written, if any.
        self.open_call: int | None = None
        self.pending: list[TokenLogprob] = []

    def feed(self, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> list[ChatEvent]:
        """Events for the next piece of output text."""
        self.pending.extend(logprobs)
        return self._events(self._split(text, final=False))

    def finish(self, cut: bool = False) -> list[ChatEvent]:
        """Events for text still held at the end of output.

        Args:
            cut (bool): the token budget ended the output. Tool-call markup
                still open is then dropped, not repaired into a call nor shown
                as content, and a call it had started ends with
                :class:`ToolCallCut`. Default: ``False``.
        """
        markup = cut and self.tools is not None and self.tools.holding
        events = self._events(self._split("", final=True, cut=cut))
        if markup:
            events.append(ToolCallCut(self.open_call))
            self.open_call = None
        if self.pending:
            events.append(TextDelta("", tuple(self.pending)))
            self.pending = []
        return events

    def finish_reason(self, engine_reason: str) -> str:
        """``tool_calls`` when the model stopped after calling tools."""
        return "tool_calls" if self.calls and engine_reason == "stop" else engine_reason

    def _split(self, text: str, final: bool, cut: bool = False) -> list[ParserDelta]:
        pieces: list[ParserDelta] = []
        if self.reasoning is not None:
            pieces += self.reasoning.feed(text) if text else []
            pieces += self.reasoning.finish() if final else []
        elif text:
            pieces.append(Content(text))
        if self.tools is None:
            return pieces
        out: list[ParserDelta] = []
        for piece in pieces:
            out += self.tools.feed(piece.text) if isinstance(piece, Content) else [piece]
        return out + (self.tools.finish(cut) if final else [])

    def _take(self) -> tuple[TokenLogprob, ...]:
        taken, self.pending = tuple(self.pending), []
        return taken

    def _events(self, deltas: list[ParserDelta]) -> list[ChatEvent]:
        events: list[ChatEvent] = []
        for delta in deltas:
            if isinstance(delta, Content):
                events.append(TextDelta(delta.text, self._take()))
            elif isinstance(delta, Reasoning):
                events.append(ReasoningDelta(delta.text, self._take()))
            elif isinstance(delta, CallBegin):
                self.dropping = not self.parallel and self.calls >= 1
                if not self.dropping:
                    events.append(ToolCallStart(self.calls, new_call_id(), delta.name))
                    self.open_call, self.calls = self.calls, self.calls + 1
            elif isinstance(delta, CallArguments) and not self.dropping:
                events.append(ToolCallArguments(self.calls - 1, delta.fragment, self._take()))
            elif isinstance(delta, CallEnd):
                self.dropping = False
                self.open_call = None
        return events


def new_call_id() -> str:
    """A tool call id, ``call_`` and 24 hex digits."""
    return "call_" + secrets.token_hex(12)

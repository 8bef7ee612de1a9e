"""One web chat turn, run through the shared turn pipeline.

A session's messages and settings become an OpenAI chat body
(:func:`chat_body`), which :func:`~mlxspec.handlers.turns.turns.open_turn`
templates and submits exactly as it does for ``POST /v1/chat/completions``;
:class:`SocketTurn` renders the :data:`~mlxspec.handlers.turns.parser.ChatEvent`
stream as frames (``turn_start``, ``text_delta``, ``thinking_delta``,
``tool_start``/``tool_end``) and returns the answer to store, as far as it
got when the turn was aborted, with the ``turn_end`` frame to send after it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mlxspec.engine import (
    ContextBudgetError,
    ContextLengthError,
    EngineRequestError,
    Finished,
    GenerationRequest,
    QueueFullError,
)
from mlxspec.errors import ApiError
from mlxspec.handlers.chat.choices import usage
from mlxspec.handlers.turns.parser import (
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallCut,
    ToolCallStart,
    TurnEnd,
)
from mlxspec.handlers.turns.turns import Turn, open_turn, turn_events
from mlxspec.handlers.webchat.frames import error_frame
from mlxspec.handlers.webchat.sessions import ChatMessage, SessionSettings

__all__ = [
    "NOT_RUN",
    "SAMPLING_FIELDS",
    "SendFrame",
    "SocketTurn",
    "as_api_error",
    "call_args",
    "chat_body",
]

#: A coroutine that sends one server frame.
SendFrame = Callable[[dict[str, Any]], Awaitable[None]]

#: The sampling fields a session may set (``set_sampling``): the reference's
#: list plus ``max_tokens``; each has the chat completion body's range.
SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "seed",
    "xtc_probability",
    "xtc_threshold",
    "repetition_penalty",
    "repetition_context_size",
    "presence_penalty",
    "frequency_penalty",
)

#: What ``tool_end`` says of a call no runner takes (a ``set_tools`` tool, or
#: any call while the coding tools are off).
NOT_RUN = "not run: the web chat runs only its coding tools, and only while they are on"


def chat_body(
    session_id: str,
    settings: SessionSettings,
    messages: Sequence[ChatMessage],
    overrides: dict[str, Any] | None = None,
    extra_tools: Sequence[dict[str, Any]] = (),
    ambient: str | None = None,
) -> dict[str, Any]:
    """The OpenAI chat completion body of a session's next turn.

    Args:
        session_id (str): the session; also the prompt cache's session
            (``session_id``), so the next turn reuses this one's KV cache.
        settings (SessionSettings): system prompt, sampling, thinking switch,
            tools (their calls are parsed as on the API, and shown), adapter.
        messages (Sequence[ChatMessage]): the conversation, ending with the
            user message to answer.
        overrides (dict | None): sampling fields for this turn only
            (``set_sampling`` with ``scope: next_turn``). Default: ``None``.
        extra_tools (Sequence[dict]): tools offered besides the session's own
            (the coding tools, when on). Default: ``()``.
        ambient (str | None): a line put before the system prompt (the app-aware
            assistant's ``[user is on: ...]``). Default: ``None``.

    Returns:
        dict: a body :func:`~mlxspec.handlers.turns.turns.open_turn` takes; a
        ``None`` sampling field is left out (the server's default).
    """
    wire: list[dict[str, Any]] = []
    system = "\n".join(t for t in (ambient, settings.system_prompt) if t)
    if system:
        wire.append({"role": "system", "content": system})
    for message in messages:
        item: dict[str, Any] = {"role": message.role, "content": _content(message)}
        if message.tool_calls:
            item["tool_calls"] = list(message.tool_calls)
        if message.role == "tool":
            item["tool_call_id"] = message.meta.get("toolCallId", "")
        wire.append(item)
    body: dict[str, Any] = {"messages": wire, "session_id": session_id}
    sampling = {**settings.sampling, **(overrides or {})}
    body.update({k: v for k, v in sampling.items() if k in SAMPLING_FIELDS and v is not None})
    if settings.thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": settings.thinking}
    tools = [*settings.tools, *extra_tools]
    if tools:
        body["tools"] = tools
    if settings.adapter is not None:
        body["adapter"] = settings.adapter
    return body


def _content(message: ChatMessage) -> str | list[dict[str, Any]]:
    """A message's chat ``content``: its text, after an ``image_url`` part (a
    ``data:`` URL) for each image a user message carries (``meta.images``, the
    ``prompt`` frame's ``[{data, mimeType}]``)."""
    images = message.meta.get("images") if message.role == "user" else None
    if not images:
        return message.content
    parts: list[dict[str, Any]] = [
        {"type": "image_url", "image_url": {"url": f"data:{i['mimeType']};base64,{i['data']}"}}
        for i in images
    ]
    return [*parts, {"type": "text", "text": message.content}]


def as_api_error(exc: Exception) -> ApiError:
    """The client-facing error of what :func:`open_turn` raises (the app's
    HTTP error handlers map the same exceptions to the same table rows)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, QueueFullError):
        return ApiError("queue_full", exc.message)
    if isinstance(exc, ContextLengthError):
        return ApiError("context_length_exceeded", exc.message, param=exc.param)
    if isinstance(exc, ContextBudgetError):
        return ApiError("context_over_budget", exc.message, param=exc.param)
    if isinstance(exc, EngineRequestError):
        return ApiError(exc.error_kind, exc.message, param=exc.param)
    return ApiError.internal()


def sampling_view(request: GenerationRequest) -> dict[str, Any]:
    """The sampling an engine request runs with, defaults applied (``turn_start``)."""
    s = request.sampling
    return {
        "temperature": s.temperature,
        "top_p": s.top_p,
        "top_k": s.top_k,
        "min_p": s.min_p,
        "max_tokens": request.max_tokens,
        "seed": s.seed,
    }


class SocketTurn:
    """One turn: submit, stream frames, and return the answer to store.

    Args:
        engine (Engine): the serving engine.
        body (dict): the chat body (:func:`chat_body`).
        session_id (str): the session, named in ``turn_start``.
        send (SendFrame): sends a frame to the socket.
        opened (Callable | None): awaited once the engine took the turn, before
            ``turn_start`` (the socket stores the turn's messages then: a refused
            turn stores nothing). Default: ``None``.
        announce (bool): send ``turn_start`` (a later model step of the same
            turn sends none). Default: ``True``.
        runs (Callable | None): whether a call to a tool of this name will be
            run (its ``tool_end`` comes from the runner); others are shown and
            answered :data:`NOT_RUN`. Default: ``None`` (none is run).
    """

    def __init__(
        self,
        engine: Any,
        body: dict[str, Any],
        session_id: str,
        send: SendFrame,
        opened: Callable[[], Awaitable[None]] | None = None,
        announce: bool = True,
        runs: Callable[[str], bool] | None = None,
    ) -> None:
        self.engine, self.body, self.session_id, self.send = engine, body, session_id, send
        self.opened, self.announce = opened, announce
        self.runs = runs or (lambda name: False)
        self._turn: Turn | None = None
        self._aborted = False
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, tuple[str, str, list[str]]] = {}
        self._first: float | None = None
        #: What ``context`` reports after the turn (prompt + answer tokens).
        self.context_tokens: int | None = None

    def abort(self) -> None:
        """Stop the turn: the engine drops the request at its next decode step."""
        self._aborted = True
        if self._turn is not None:
            self._turn.handle.cancel()

    async def run(self) -> tuple[ChatMessage | None, dict[str, Any]]:
        """Run the turn to its end, all but its ``turn_end`` frame (the socket
        sends that once the answer is stored, so a client that saw it may
        start the next turn at once).

        Returns:
            tuple[ChatMessage | None, dict]: the assistant's answer (``meta``
            holds ``finishReason``, ``lane``, ``usage``, ``stats``), partial
            when aborted, or ``None`` when the turn could not start (an
            ``error`` frame said why); and the ``turn_end`` frame.
        """
        started = time.monotonic()
        try:
            self._turn = turn = await open_turn(self.engine, self.body)
        except (ApiError, EngineRequestError, QueueFullError) as exc:
            await self.send(error_frame(as_api_error(exc)))
            return None, {"type": "turn_end", "finishReason": "error"}
        if self._aborted:  # the abort came while the prompt was templated
            turn.handle.cancel()
        if self.opened is not None:
            try:
                await self.opened()
            except BaseException:
                turn.handle.cancel()  # not stored: free its slot
                raise
        sampling = sampling_view(turn.request)
        adapter = "+".join(turn.request.adapter) or None  # what the engine request runs with
        if self.announce:
            await self.send(
                {
                    "type": "turn_start",
                    "sessionId": self.session_id,
                    "sampling": sampling,
                    "adapter": adapter,
                }
            )
        finished: Finished | None = None
        reason = "aborted"
        try:
            async for event in turn_events(turn):
                if isinstance(event, TurnEnd):
                    finished, reason = event.finished, event.finish_reason
                else:
                    await self._on_event(event)
        except ApiError as exc:
            if exc.kind != "cancelled":
                await self.send(error_frame(exc))
                reason = "error"
        finally:
            turn.handle.cancel()  # a no-op once finished; frees the slot if this task is cancelled
        await self._send_calls()
        return await self._finish(finished, reason, started, sampling)

    async def _on_event(self, event: Any) -> None:
        if self._first is None:
            self._first = time.monotonic()
        if isinstance(event, TextDelta) and event.text:
            self._text.append(event.text)
            await self.send({"type": "text_delta", "delta": event.text})
        elif isinstance(event, ReasoningDelta) and event.text:
            self._reasoning.append(event.text)
            await self.send({"type": "thinking_delta", "delta": event.text})
        elif isinstance(event, ToolCallStart):
            self._calls[event.index] = (event.id, event.name, [])
        elif isinstance(event, ToolCallArguments) and event.index in self._calls:
            self._calls[event.index][2].append(event.fragment)
        elif isinstance(event, ToolCallCut) and event.index is not None:
            self._calls.pop(event.index, None)  # cut off by max_tokens: no call

    async def _send_calls(self) -> None:
        """``tool_start`` for each complete call; ``tool_end`` too for a call
        that is shown, not run (a call to run gets it from the runner)."""
        for call_id, name, fragments in self._calls.values():
            await self.send(
                {"type": "tool_start", "callId": call_id, "tool": name, "args": _args(fragments)}
            )
            if self._aborted or not self.runs(name):
                end = {"type": "tool_end", "callId": call_id, "ok": False, "result": NOT_RUN}
                await self.send(end)

    async def _finish(
        self, finished: Finished | None, reason: str, started: float, sampling: dict[str, Any]
    ) -> tuple[ChatMessage, dict[str, Any]]:
        meta: dict[str, Any] = {"finishReason": reason, "sampling": sampling}
        end: dict[str, Any] = {"type": "turn_end", "finishReason": reason}
        if finished is not None:
            ttft = None if self._first is None else (self._first - started) * 1000
            decode = time.monotonic() - (self._first or started)
            rate = (finished.completion_tokens - 1) / decode if decode > 0 else None
            stats = {
                "ttftMs": None if ttft is None else round(ttft, 1),
                "tokensPerSecond": None if rate is None else round(max(rate, 0.0), 2),
                "cachedTokens": finished.cached_tokens,
            }
            meta.update(lane=finished.lane, usage=usage(finished), stats=stats)
            end.update(lane=finished.lane, usage=meta["usage"], stats=stats)
            self.context_tokens = finished.prompt_tokens + finished.completion_tokens
        calls = tuple(
            {"id": cid, "type": "function", "function": {"name": name, "arguments": "".join(args)}}
            for cid, name, args in self._calls.values()
        )
        reasoning = "".join(self._reasoning) or None
        return ChatMessage("assistant", "".join(self._text), reasoning, calls, meta), end


def _args(fragments: list[str]) -> Any:
    return call_args("".join(fragments))


def call_args(text: str) -> Any:
    """A call's arguments as JSON when they parse, else the raw text."""
    try:
        return json.loads(text)
    except ValueError:
        return text

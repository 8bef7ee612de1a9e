"""Chat events -> OpenAI Responses output items and stream events (pure).

:class:`ResponseBuilder` folds the :data:`~mlxspec.handlers.turns.turns.ChatEvent`
stream of one turn into a Responses ``output`` list, and says at each step
which stream events OpenAI sends for it (Responses API reference, "Streaming
events"): ``response.created``, ``response.in_progress``, then per output
item ``response.output_item.added`` ... ``response.output_item.done`` (a
``reasoning`` item with ``reasoning_summary_*`` events, a ``message`` item with
``content_part``/``output_text`` events, ``function_call`` items with
``function_call_arguments`` events), and one terminal ``response.completed``
or ``response.incomplete``; after a failure ``error`` then ``response.failed``.
The non-streamed reply is the same fold with its events discarded, so both
forms always agree.
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mlxspec.engine import Finished
from mlxspec.errors import ApiError
from mlxspec.handlers.turns.parser import (
    ChatEvent,
    ChatTurn,
    ReasoningDelta,
    TextDelta,
    ToolCallArguments,
    ToolCallCut,
    ToolCallStart,
    TurnEnd,
)

#: One stream event: its SSE event name and its JSON payload (``type`` equals the name).
Frame = tuple[str, dict[str, Any]]


def item_id(prefix: str) -> str:
    """An output item id such as ``msg_<32 hex>`` (OpenAI's prefixes: resp, msg, fc, rs)."""
    return f"{prefix}_{uuid.uuid4().hex}"


def response_usage(finished: Finished, reasoning_tokens: int = 0) -> dict[str, Any]:
    """The Responses ``usage`` object of a finished turn.

    Args:
        finished (Finished): the engine's counts.
        reasoning_tokens (int): output tokens spent thinking, capped at the
            output count. Default: ``0``.
    """
    return {
        "input_tokens": finished.prompt_tokens,
        "input_tokens_details": {"cached_tokens": finished.cached_tokens},
        "output_tokens": finished.completion_tokens,
        "output_tokens_details": {
            "reasoning_tokens": min(reasoning_tokens, finished.completion_tokens)
        },
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
    }


def turn_as_events(turn: ChatTurn) -> list[ChatEvent]:
    """A collected turn replayed as events (reasoning, text, tool calls, end)."""
    events: list[ChatEvent] = []
    if turn.reasoning:
        events.append(ReasoningDelta(turn.reasoning))
    if turn.content:
        events.append(TextDelta(turn.content))
    for i, call in enumerate(turn.tool_calls):
        events += [ToolCallStart(i, call.id, call.name), ToolCallArguments(i, call.arguments)]
    assert turn.finished is not None
    events.append(TurnEnd(turn.finish_reason, turn.finished))
    return events


@dataclass
class _Open:
    """The output item being written: its index in ``output``, its text so far,
    and (function calls) whether the token budget cut it off."""

    index: int
    pieces: list[str] = field(default_factory=list)
    cut: bool = False


@dataclass(frozen=True)
class _TextItem:
    """How a text-bearing output item streams (Responses API "Streaming events")."""

    part_type: str
    slot: str
    part_added: str
    delta: str
    text_done: str
    part_done: str
    #: The delta and text-done events carry ``logprobs`` (always empty here).
    logprobs: bool = False

    def extra(self) -> dict[str, Any]:
        """Fields the delta and text-done events add."""
        return {"logprobs": []} if self.logprobs else {}

    def part(self, text: str) -> dict[str, Any]:
        """The item's content (or summary) part holding ``text``."""
        part: dict[str, Any] = {"type": self.part_type, "text": text}
        if self.part_type == "output_text":
            part["annotations"] = []
        return part


_TEXT_ITEMS = {
    "message": _TextItem(
        "output_text",
        "content_index",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        logprobs=True,
    ),
    "reasoning": _TextItem(
        "summary_text",
        "summary_index",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
    ),
}


class ResponseBuilder:
    """Fold one turn's chat events into a Responses object, emitting stream events.

    Args:
        response (dict): the response skeleton (``id``, ``model``, echoed
            request fields); ``status``, ``output`` and ``usage`` are filled here.
        count_tokens (Callable[[str], int]): tokens in a text, for
            ``reasoning_tokens``. Default: counts nothing.
    """

    def __init__(
        self, response: dict[str, Any], count_tokens: Callable[[str], int] = lambda _t: 0
    ) -> None:
        self.response = {**response, "status": "in_progress", "output": [], "usage": None}
        self.count_tokens = count_tokens
        self.sequence = 0
        self._open: _Open | None = None
        self._calls: dict[int, _Open] = {}
        self._reasoning: list[str] = []
        self.tool_calls: list[dict[str, str]] = []

    @property
    def output(self) -> list[dict[str, Any]]:
        """The output items so far."""
        return self.response["output"]

    def frame(self, kind: str, **fields: Any) -> Frame:
        """One numbered stream event ``{"type": kind, **fields, "sequence_number": n}``."""
        payload = {"type": kind, **fields, "sequence_number": self.sequence}
        self.sequence += 1
        return kind, payload

    def snapshot(self) -> dict[str, Any]:
        """A deep copy of the response as it stands (events must not alias it)."""
        return copy.deepcopy(self.response)

    def view(self) -> dict[str, Any]:
        """A copy of the response as it stands with the open item's text (or
        call arguments) so far filled in, for reading a running response; the
        stream's own events carry that text as deltas instead."""
        response = self.snapshot()
        if self._open is not None:
            item = response["output"][self._open.index]
            text = "".join(self._open.pieces)
            if item["type"] == "function_call":
                item["arguments"] = text
            elif item["type"] == "message":
                item["content"] = [_TEXT_ITEMS["message"].part(text)]
            else:
                item["summary"] = [_TEXT_ITEMS["reasoning"].part(text)]
        return response

    def stop(self, status: str) -> None:
        """End a turn that will get no :class:`TurnEnd` (cancelled, or failed):
        the open item is closed ``incomplete`` with its text so far (a call cut
        mid-arguments is incomplete and no tool call), and the response takes
        ``status``. No events: nobody reads a stopped turn's stream."""
        if self._open is not None and self.output[self._open.index]["type"] == "function_call":
            self._open.cut = True
        self._close("incomplete")
        self.response["status"] = status

    def start(self) -> list[Frame]:
        """``response.created`` and ``response.in_progress``."""
        return [
            self.frame("response.created", response=self.snapshot()),
            self.frame("response.in_progress", response=self.snapshot()),
        ]

    def feed(self, event: ChatEvent) -> list[Frame]:
        """The stream events one chat event causes (none for empty text or an
        event kind this surface does not show)."""
        if isinstance(event, TextDelta):
            return self._text("message", event.text) if event.text else []
        if isinstance(event, ReasoningDelta):
            self._reasoning.append(event.text)
            return self._text("reasoning", event.text)
        if isinstance(event, ToolCallStart):
            return self._start_call(event)
        if isinstance(event, ToolCallArguments):
            call = self._calls[event.index]
            call.pieces.append(event.fragment)
            return [
                self.frame(
                    "response.function_call_arguments.delta",
                    item_id=self.output[call.index]["id"],
                    output_index=call.index,
                    delta=event.fragment,
                )
            ]
        if isinstance(event, ToolCallCut):
            if event.index is not None:
                self._calls[event.index].cut = True
            return []
        if isinstance(event, TurnEnd):
            return self.finish(event)
        return []

    def finish(self, end: TurnEnd) -> list[Frame]:
        """Close the open item, complete the response, and its terminal event.

        A turn with neither text nor tool calls still answers one (empty)
        message item, so ``output_text`` is always defined.
        """
        incomplete = end.finish_reason == "length"
        status = "incomplete" if incomplete else "completed"
        frames = self._close(status)
        if not any(item["type"] in ("message", "function_call") for item in self.output):
            frames += self._switch("message") + self._close(status)
        self.response["status"] = status
        self.response["incomplete_details"] = (
            {"reason": "max_output_tokens"} if incomplete else None
        )
        self.response["completed_at"] = None if incomplete else int(time.time())
        reasoning = self.count_tokens("".join(self._reasoning)) if self._reasoning else 0
        self.response["usage"] = response_usage(end.finished, reasoning)
        kind = "response.incomplete" if incomplete else "response.completed"
        return frames + [self.frame(kind, response=self.snapshot())]

    def fail(self, err: ApiError) -> list[Frame]:
        """``error`` then ``response.failed`` for a turn that broke mid-stream."""
        code = err.spec.code or err.spec.type
        self.response["status"] = "failed"
        self.response["error"] = {"code": code, "message": err.message}
        return [
            self.frame("error", code=code, message=err.message, param=err.param),
            self.frame("response.failed", response=self.snapshot()),
        ]

    def _text(self, kind: str, text: str) -> list[Frame]:
        """Append ``text`` to the open ``kind`` item (opening one if needed): its delta event."""
        frames = self._switch(kind)
        assert self._open is not None
        self._open.pieces.append(text)
        index, spec = self._open.index, _TEXT_ITEMS[kind]
        return frames + [
            self.frame(
                spec.delta,
                item_id=self.output[index]["id"],
                output_index=index,
                **{spec.slot: 0},
                delta=text,
                **spec.extra(),
            )
        ]

    def _switch(self, kind: str) -> list[Frame]:
        """Keep writing the open item if it is a ``kind`` item, else close it and open one."""
        if self._open is not None and self.output[self._open.index]["type"] == kind:
            return []
        frames = self._close("completed")
        index, spec = len(self.output), _TEXT_ITEMS[kind]
        item: dict[str, Any]
        if kind == "message":
            item = {"id": item_id("msg"), "type": "message", "status": "in_progress"}
            item.update(role="assistant", content=[])
        else:
            item = {"id": item_id("rs"), "type": "reasoning", "summary": []}
        self.output.append(item)
        self._open = _Open(index)
        return frames + [
            self.frame("response.output_item.added", output_index=index, item=copy.deepcopy(item)),
            self.frame(
                spec.part_added,
                item_id=item["id"],
                output_index=index,
                **{spec.slot: 0},
                part=spec.part(""),
            ),
        ]

    def _start_call(self, event: ToolCallStart) -> list[Frame]:
        frames = self._close("completed")
        index = len(self.output)
        item = {"id": item_id("fc"), "type": "function_call", "status": "in_progress"}
        item.update(call_id=event.id, name=event.name, arguments="")
        self.output.append(item)
        self._open = self._calls[event.index] = _Open(index)
        return frames + [
            self.frame("response.output_item.added", output_index=index, item=copy.deepcopy(item))
        ]

    def _close(self, status: str) -> list[Frame]:
        """The ``*.done`` events of the open item; fills in its final fields."""
        if self._open is None:
            return []
        index, text, cut = self._open.index, "".join(self._open.pieces), self._open.cut
        self._open = None
        item = self.output[index]
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call" and cut:
            # Cut by the budget mid-stream: what was streamed stays, marked
            # incomplete; its arguments are never "done" nor kept for a continuation.
            item.update(status="incomplete", arguments=text)
            frames = []
        elif item["type"] == "function_call":
            # Its arguments are whole (a call the budget cut is handled above),
            # so the call is complete even when the response is not.
            item.update(status="completed", arguments=text)
            self.tool_calls.append({"id": item["call_id"], "name": item["name"], "arguments": text})
            done = "response.function_call_arguments.done"
            frames = [self.frame(done, **ids, name=item["name"], arguments=text)]
        else:
            spec = _TEXT_ITEMS[item["type"]]
            if item["type"] == "message":
                item.update(status=status, content=[spec.part(text)])
            else:
                item["summary"] = [spec.part(text)]
            frames = [
                self.frame(spec.text_done, **ids, **{spec.slot: 0}, text=text, **spec.extra()),
                self.frame(spec.part_done, **ids, **{spec.slot: 0}, part=spec.part(text)),
            ]
        return frames + [
            self.frame("response.output_item.done", output_index=index, item=copy.deepcopy(item))
        ]

    def output_text(self) -> str | None:
        """The message items' text joined (``None`` when there is no message item)."""
        texts = [
            p["text"] for item in self.output if item["type"] == "message" for p in item["content"]
        ]
        return "".join(texts) if texts else None

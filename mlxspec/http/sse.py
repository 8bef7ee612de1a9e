"""The one module that writes Server-Sent Events.

Only this module produces ``data:`` and ``event:`` lines, keep-alive comments,
in-band error frames and the ``data: [DONE]`` terminator, and sets the stream
headers (WHATWG HTML "Server-sent events" section 9.2 for the framing).
Handlers give it an async iterator of JSON-able payloads: OpenAI streams are
bare ``data:`` events ending in ``[DONE]`` (:func:`openai_events`); Anthropic
streams are named events whose name is the payload's ``type``
(:func:`anthropic_events`).
"""

from __future__ import annotations

import asyncio
import collections
import json
import operator
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from starlette.responses import StreamingResponse

from mlxspec.errors import ApiError, anthropic_error_body, from_exception, openai_error_json

DONE = b"data: [DONE]\n\n"
KEEPALIVE = b": keep-alive\n\n"
HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


#: Line breaks for ``str.splitlines`` (so for httpx's ``iter_lines`` and
#: httpx-sse) that JSON leaves raw; escaped, they cannot split a frame.
_LINE_BREAKS = str.maketrans({"\u2028": "\\u2028", "\u2029": "\\u2029", "\x85": "\\u0085"})


#: JSON's own string encoder (what ``json.dumps`` calls for a ``str`` with
#: ``ensure_ascii=False``).
_encode_string = json.encoder.encode_basestring


#: What ``json.dumps(payload, ensure_ascii=False, separators=(",", ":"))``
#: builds on every call (an encoder with non-default options), built once.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _json_line(payload: Any) -> bytes:
    return _ENCODER.encode(payload).translate(_LINE_BREAKS).encode()


def data_frame(payload: Any) -> bytes:
    """Encode one JSON payload as a ``data:`` event.

    JSON escapes ``\\n`` and ``\\r``; U+2028, U+2029 and U+0085 are escaped
    here too (they can only occur inside JSON strings, where a ``\\u`` escape means
    the same), so one ``data:`` line suffices for every line-based parser.

    Args:
        payload: any JSON-serialisable value.

    Returns:
        bytes: ``b"data: <json>\\n\\n"``, UTF-8.
    """
    return b"data: " + _json_line(payload) + b"\n\n"


class FrameTemplate:
    """``data:`` frames of one payload shape whose only varying part is one
    string: the constant bytes around it are serialised once.

    ``template.frame(text)`` equals ``data_frame(payload)`` byte for byte,
    where ``payload`` is ``template``'s payload with :data:`SLOT` replaced by
    ``text`` (JSON writes an object member by member, so the frame is the
    constant prefix, the string's own JSON, and the constant suffix).

    Args:
        payload: a JSON-serialisable value holding :data:`SLOT` exactly once,
            as a string value.

    Raises:
        ValueError: :data:`SLOT` is not in ``payload`` exactly once.
    """

    def __init__(self, payload: Any) -> None:
        parts = data_frame(payload).split(_json_line(SLOT))
        if len(parts) != 2:
            raise ValueError("a frame template needs the slot exactly once")
        self.prefix, self.suffix = parts

    def frame(self, text: str) -> bytes:
        """The frame with ``text`` in the slot."""
        # json.dumps(text, ensure_ascii=False) without building an encoder.
        return self.prefix + _encode_string(text).translate(_LINE_BREAKS).encode() + self.suffix


#: The placeholder of a :class:`FrameTemplate` (a control character no
#: generated text holds in this position, since the slot is replaced whole).
SLOT = "\x00mlxspec-slot\x00"


def chunk_framer(
    head: dict[str, Any], text_choice: dict[str, Any]
) -> Callable[[dict[str, Any]], dict[str, Any] | bytes]:
    """The framer of an OpenAI stream's chunks, ``{**head, "choices": [choice]}``,
    that encodes only the text of a per-token chunk.

    A choice shaped as ``text_choice`` (its other members equal, a string
    where :data:`SLOT` stands) comes out as its frame already (``bytes``),
    from a :class:`FrameTemplate` per choice ``index``: equal, byte for byte,
    to :func:`data_frame` of the chunk. Any other choice comes back as the
    chunk object, for :func:`openai_events` to frame (the caller may still add
    to it, e.g. ``usage``). This runs once per streamed token.

    Args:
        head (dict): the chunk's members before ``choices`` (``id``, ``object``, ...).
        text_choice (dict): a per-token choice without its ``index``: constant
            members, and :data:`SLOT` where the text goes, as a member or as
            the only member of an object member (chat's ``delta: {"content": SLOT}``).

    Returns:
        Callable: choice object -> its frame (``bytes``) or its chunk (``dict``).

    Raises:
        ValueError: ``text_choice`` holds no :data:`SLOT` where it may stand.
    """
    outer, key = _slot_path(text_choice)
    fixed = [k for k in text_choice if k != (outer or key)]
    members_of = operator.itemgetter(*fixed) if fixed else lambda choice: None
    expected = members_of(text_choice)
    size = len(text_choice) + 1  # and ``index``
    templates: dict[int, FrameTemplate] = {}

    def template(choice: dict[str, Any]) -> FrameTemplate:
        slot = SLOT if outer is None else {key: SLOT}
        slotted = {**head, "choices": [{**choice, (outer or key): slot}]}
        templates[choice["index"]] = made = FrameTemplate(slotted)
        return made

    def frame(choice: dict[str, Any]) -> dict[str, Any] | bytes:
        text = None
        try:  # the per-token shape, in as few lookups as may be (once per token)
            if len(choice) == size and members_of(choice) == expected:
                inner = choice if outer is None else choice[outer]
                if outer is None or len(inner) == 1:
                    text = inner.get(key)
        except (KeyError, TypeError, AttributeError):  # another shape
            pass
        if text is None:
            return {**head, "choices": [choice]}
        return (templates.get(choice["index"]) or template(choice)).frame(text)

    return frame


def _slot_path(text_choice: dict[str, Any]) -> tuple[str | None, str]:
    """Where :data:`SLOT` stands in ``text_choice``: ``(None, key)`` for a
    member, ``(outer, key)`` for the only member of an object member."""
    for key, value in text_choice.items():
        if value is SLOT:
            return None, key
        if type(value) is dict and list(value.values()) == [SLOT]:
            return key, next(iter(value))
    raise ValueError("a per-token choice needs the slot as a member or an object's only member")


def error_frame(err: ApiError) -> bytes:
    """An in-band OpenAI error event, sent when a stream fails after its headers."""
    return b"data: " + openai_error_json(err).encode() + b"\n\n"


async def openai_events(
    payloads: AsyncIterator[Any], on_close: Callable[[], None] | None = None
) -> AsyncIterator[bytes]:
    """Frame an OpenAI-style stream: each payload as ``data:``, then ``[DONE]``.

    A failure mid-stream becomes one error frame (the error
    :func:`~mlxspec.errors.from_exception` maps it to) and the stream ends
    without ``[DONE]`` (reference, chat "Streaming"). ``on_close`` always
    runs, also when the client disconnects (Starlette cancels the iterator),
    so the engine request is cancelled.

    Args:
        payloads (AsyncIterator): JSON-able chunks, in order.
        on_close (Callable | None): cleanup, e.g. ``handle.cancel``. Default: ``None``.

    Yields:
        bytes: SSE frames.
    """
    try:
        async for payload in payloads:
            yield payload if isinstance(payload, bytes) else data_frame(payload)
        yield DONE
    except Exception as exc:
        yield error_frame(from_exception(exc))
    finally:
        if on_close is not None:
            on_close()


def retry_frame(milliseconds: int) -> bytes:
    """The ``retry:`` field alone: how long an EventSource waits before it
    reconnects (WHATWG HTML, "Server-sent events", the ``retry`` field).

    Args:
        milliseconds (int): the reconnection time, ms.

    Returns:
        bytes: ``b"retry: <ms>\\n\\n"``.
    """
    return b"retry: %d\n\n" % int(milliseconds)


def named_frame(event: str, payload: Any) -> bytes:
    """Encode one named event: an ``event:`` line, then one ``data:`` line
    escaped as in :func:`data_frame`.

    Args:
        event (str): the event name, e.g. ``response.output_text.delta`` or
            ``message_start``; one line.
        payload: any JSON-serialisable value.

    Returns:
        bytes: ``b"event: <name>\\ndata: <json>\\n\\n"``, UTF-8.

    Raises:
        ValueError: ``event`` contains a line break (it would split the frame).
    """
    if any(ch in event for ch in "\r\n"):
        raise ValueError(f"SSE event name must be one line: {event!r}")
    return b"event: " + event.encode() + b"\n" + data_frame(payload)


async def anthropic_events(
    payloads: AsyncIterator[Any], on_close: Callable[[], None] | None = None
) -> AsyncIterator[bytes]:
    """Frame an Anthropic Messages stream: each payload as a named event.

    The event name is the payload's ``type`` (Anthropic's "Streaming Messages":
    ``event: message_start`` carries ``{"type": "message_start", ...}``); there
    is no terminator beyond ``message_stop``. A failure mid-stream becomes one
    ``event: error`` frame with Anthropic's error envelope and the stream ends.
    ``on_close`` always runs, as in :func:`openai_events`.

    Args:
        payloads (AsyncIterator[dict | bytes]): stream events, each with a
            ``type``; ``bytes`` (a keep-alive comment) pass through as they are.
        on_close (Callable | None): cleanup, e.g. ``handle.cancel``. Default: ``None``.

    Yields:
        bytes: SSE frames.
    """

    async def pairs() -> AsyncIterator[tuple[str, Any] | bytes]:
        async for payload in payloads:
            yield payload if isinstance(payload, bytes) else (payload["type"], payload)

    def on_error(err: ApiError) -> list[tuple[str, Any]]:
        return [("error", anthropic_error_body(err))]

    async for frame in named_events(pairs(), on_error, on_close):
        yield frame


async def named_events(
    frames: AsyncIterator[tuple[str, Any] | bytes],
    on_error: Callable[[ApiError], Iterable[tuple[str, Any]]],
    on_close: Callable[[], None] | None = None,
) -> AsyncIterator[bytes]:
    """Frame a stream of named events (OpenAI Responses, Anthropic): no ``[DONE]``.

    The protocol's own terminal event ends the stream. A failure mid-stream is
    mapped by :func:`~mlxspec.errors.from_exception` (an unexpected exception
    is logged and reported as the internal error) and handed to ``on_error``,
    whose events (e.g. ``error`` then ``response.failed``) close the stream.
    ``on_close`` always runs, also on client disconnect.

    Args:
        frames (AsyncIterator[tuple[str, Any] | bytes]): ``(event name,
            payload)`` pairs, or bytes already framed (keep-alive comments).
        on_error (Callable): ``ApiError -> [(event name, payload), ...]``.
        on_close (Callable | None): cleanup, e.g. ``handle.cancel``. Default: ``None``.

    Yields:
        bytes: SSE frames.
    """
    try:
        try:
            async for frame in frames:
                # bytes are already framed (e.g. a keep-alive comment)
                yield frame if isinstance(frame, bytes) else named_frame(*frame)
        except Exception as exc:
            failure = from_exception(exc)
        else:
            return
        for event, payload in on_error(failure):
            yield named_frame(event, payload)
    finally:
        if on_close is not None:
            on_close()


#: Seconds of silence after which a stream sends a ``: keep-alive`` comment
#: (while a long tool call is withheld, or a long prefill runs).
KEEPALIVE_INTERVAL_S = 10.0


async def with_keepalive(
    payloads: AsyncIterator[Any], interval: float | None = None
) -> AsyncIterator[Any]:
    """Pass ``payloads`` through, adding :data:`KEEPALIVE` after each
    ``interval`` seconds without one (reference, chat "Streaming": heartbeats
    keep client idle timers from closing a call that is being buffered).

    One pump task reads the source for the whole stream (the source is never
    cancelled mid-item by a timeout), and one timer is re-armed only when it
    fires, so a payload costs no task, no ``asyncio.wait`` and no timer of its
    own: this sits on every streamed token's path.

    Args:
        payloads (AsyncIterator): the stream's payloads.
        interval (float | None): seconds of silence. Default: :data:`KEEPALIVE_INTERVAL_S`.

    Yields:
        The payloads, with ``KEEPALIVE`` bytes in the gaps.

    Raises:
        Exception: whatever ``payloads`` raised, after the items before it.
    """
    pump = _Pump(payloads, KEEPALIVE_INTERVAL_S if interval is None else interval)
    try:
        while True:
            item = await pump.next()
            if item is _END:
                return
            yield item
    finally:
        pump.close()


_END = object()


class _Pump:
    """Reads an async iterator in its own task into a buffer; :meth:`next`
    returns the next item, :data:`KEEPALIVE` after ``interval`` seconds
    without one, or ``_END``."""

    def __init__(self, source: AsyncIterator[Any], interval: float) -> None:
        self.loop = asyncio.get_running_loop()
        self.interval = interval
        self.items: collections.deque[Any] = collections.deque()
        self.error: BaseException | None = None
        self.ended = False
        self.waiter: asyncio.Future[None] | None = None
        self.last = self.loop.time()  # when the consumer last got something
        self.timer = self.loop.call_at(self.last + interval, self._tick)
        self.task = asyncio.ensure_future(self._run(source))

    async def _run(self, source: AsyncIterator[Any]) -> None:
        try:
            async for item in source:
                self.items.append(item)
                self._wake()
        except Exception as exc:  # re-raised by next(), in the consumer
            self.error = exc
        except asyncio.CancelledError as exc:  # by close(), or from inside the source
            self.error = exc
            raise
        finally:  # the consumer never waits on a pump that stopped
            self.ended = True
            self._wake()

    def _wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _tick(self) -> None:
        # Re-arm for the rest of the interval when something went out meanwhile.
        due = self.last + self.interval
        if self.loop.time() < due:
            self.timer = self.loop.call_at(due, self._tick)
            return
        self.timer = self.loop.call_at(self.loop.time() + self.interval, self._tick)
        self._wake()

    async def next(self) -> Any:
        while not self.items and not self.ended:
            self.waiter = self.loop.create_future()
            due = self.last + self.interval
            await self.waiter
            if not self.items and not self.ended and self.loop.time() >= due:
                self.last = self.loop.time()
                return KEEPALIVE
        self.last = self.loop.time()
        if self.items:
            return self.items.popleft()
        if self.error is not None:
            raise self.error
        return _END

    def close(self) -> None:
        self.timer.cancel()
        self.task.cancel()


def event_stream(frames: AsyncIterator[bytes]) -> StreamingResponse:
    """Wrap SSE frames in a ``text/event-stream`` response with no-cache headers."""
    return StreamingResponse(frames, media_type="text/event-stream", headers=dict(HEADERS))

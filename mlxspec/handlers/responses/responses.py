"""``/v1/responses``: OpenAI's Responses API on the chat path.

``POST /v1/responses`` (operationId ``createResponse``) translates the body
to a chat body (:mod:`.responses_input`), runs one chat turn, and answers the
turn folded into a Response object (:mod:`.responses_output`), as JSON or as
OpenAI's named stream events. A finished response (completed or incomplete,
never failed) is stored, with its conversation, unless ``store`` is false;
``previous_response_id`` continues from it. ``GET`` and ``DELETE
/v1/responses/{response_id}`` read and remove stored responses, as OpenAI's
API does; ``GET`` also answers while a response still runs. With
``background: true`` the request answers at once (``queued``) and the turn
runs on without the client, who polls ``GET`` and may ``POST
/v1/responses/{response_id}/cancel``. Errors use the OpenAI envelope.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from connexion.context import scope

from mlxspec.engine import EngineProtocol, PromptError
from mlxspec.errors import ApiError
from mlxspec.handlers.adapters.select import with_model
from mlxspec.handlers.context import JSON, current_engine, now
from mlxspec.handlers.responses.input import assistant_message, to_chat_body
from mlxspec.handlers.responses.output import Frame, ResponseBuilder, item_id, turn_as_events
from mlxspec.handlers.responses.store import Conversation, ResponseStore, Running, StoredResponse
from mlxspec.handlers.turns.turns import Turn, collect_turn, count_prompt, open_turn, turn_events
from mlxspec.http import sse


def current_store() -> ResponseStore:
    """The process's response store (placed in the ASGI scope by the app)."""
    return scope["state"]["response_store"]


def not_found(response_id: str, param: str) -> ApiError:
    """The 404 for a response id that is unknown, expired or deleted."""
    return ApiError(
        "response_not_found", f"response '{response_id}' not found or expired", param=param
    )


async def create_response(body: dict[str, Any]) -> Any:
    """Run one turn and answer a Response object, or its event stream; with
    ``background: true`` (and no ``stream``), answer the ``queued`` response at
    once and run the turn on its own.

    A ``text.format`` grammar (or a forced tool call's) that cannot be enforced
    runs unconstrained with a ``Warning`` header, as on chat completions
    (reference, "Structured output"; see :func:`~.turns.open_turn`).

    Raises:
        ApiError: 404 ``response_not_found`` for an unknown or expired
            ``previous_response_id``, 400 when it is still running; 400 naming
            ``input`` for a prompt the template or the model cannot take; 400
            for ``background`` with ``store: false``; the chat path's engine errors.
    """
    engine, store = current_engine(), current_store()
    background = body.get("background") is True
    stored = body.get("store") is not False
    if background and not stored:
        raise ApiError(
            "invalid_request",
            "background responses must be stored: background: true cannot be combined "
            "with store: false",
            param="background",
        )
    chat, conversation = to_chat_body(body, _previous(store, body))
    try:
        turn = await open_turn(engine, with_model(chat, body), prompt_param="input")
    except PromptError as exc:
        raise _input_error(exc) from exc
    builder = ResponseBuilder(_skeleton(body, turn, conversation, engine), _token_counter(engine))
    keep = _keeper(store, conversation, builder, stored)
    response_id, view = builder.response["id"], _view(builder, turn)
    if body.get("stream"):
        frames_of_turn = _frames(turn, builder, keep)
        if stored:
            store.begin(response_id, Running(view, turn.handle.cancel, background))
            end = _stream_end(builder, keep, store, background)
            frames_of_turn = _listed(frames_of_turn, end)
        # Keep-alive comments fill silences (a withheld tool call, a long prefill).
        events = sse.with_keepalive(frames_of_turn)
        frames = sse.named_events(events, builder.fail, on_close=turn.handle.cancel)
        response = sse.event_stream(frames)
        response.headers.update(turn.warning)
        return response
    if background:
        task = asyncio.ensure_future(_run_in_background(turn, builder, keep, store))
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)
        store.begin(response_id, Running(view, turn.handle.cancel, True, task))
        return view(), 200, {**JSON, **turn.warning}
    if stored:
        store.begin(response_id, Running(view, turn.handle.cancel))
    try:
        result = await collect_turn(turn)
        for event in turn_as_events(result):
            builder.feed(event)
        keep()
    finally:
        store.end(response_id)
    return builder.response, 200, {**JSON, **turn.warning}


#: Background turns in flight (the event loop keeps only weak references to tasks).
_BACKGROUND: set[asyncio.Future[None]] = set()


async def _run_in_background(
    turn: Turn, builder: ResponseBuilder, keep: Callable[[], None], store: ResponseStore
) -> None:
    """Run a background turn to its end and store it: ``completed`` or
    ``incomplete``, ``cancelled`` when cancelled, ``failed`` (with ``error``)
    when the engine failed. Its client is gone, so nothing cancels it but
    ``POST /v1/responses/{id}/cancel`` (and the server's shutdown)."""
    try:
        async for _ in _frames(turn, builder, keep):
            pass
    except ApiError as exc:
        cancelled = exc.kind == "cancelled"  # the engine request was cancelled
        builder.stop("cancelled" if cancelled else "failed")
        if not cancelled:
            builder.fail(exc)  # sets ``error``
        keep()
    finally:
        store.end(builder.response["id"])


def _view(builder: ResponseBuilder, turn: Turn) -> Callable[[], dict[str, Any]]:
    """Reads a running response as it stands: ``queued`` until the engine
    starts the request, then ``in_progress`` with the output so far."""

    def view() -> dict[str, Any]:
        response = builder.view()
        if response["status"] == "in_progress" and turn.handle.started_at is None:
            response["status"] = "queued"
        return response

    return view


async def count_response_input_tokens(body: dict[str, Any]) -> Any:
    """``{"object": "response.input_tokens", "input_tokens": n}``: the length of
    the prompt :func:`create_response` would run for the same body (the same
    translation, ``previous_response_id`` conversation and template).

    Raises:
        ApiError: 404 ``response_not_found`` for an unknown or expired
            ``previous_response_id``; 400 naming ``input`` for a prompt the
            template cannot take.
    """
    engine = current_engine()
    chat, _ = to_chat_body(body, _previous(current_store(), body))
    try:
        tokens = await count_prompt(engine, chat)
    except PromptError as exc:
        raise _input_error(exc) from exc
    return {"object": "response.input_tokens", "input_tokens": tokens}, 200, JSON


def _input_error(exc: PromptError) -> ApiError:
    """A chat prompt error in the Responses body's terms: its param indexes the
    translated chat messages, which the client never saw (``input``), unless
    it names ``chat_template_kwargs``, a field of both bodies."""
    shared = (exc.param or "").startswith("chat_template_kwargs")
    return ApiError("invalid_request", exc.message, param=exc.param if shared else "input")


def _previous(store: ResponseStore, body: dict[str, Any]) -> Conversation | None:
    """The stored conversation ``previous_response_id`` names, or ``None`` without one.

    Raises:
        ApiError: 404 ``response_not_found`` for an unknown or expired id;
            400 for a response that is still running.
    """
    previous_id = body.get("previous_response_id")
    if previous_id is None:
        return None
    if store.running(previous_id) is not None:
        raise ApiError(
            "invalid_request",
            f"response '{previous_id}' is still running; continue from it once it has finished",
            param="previous_response_id",
        )
    stored = store.get(previous_id)
    if stored is None:
        raise not_found(previous_id, "previous_response_id")
    return stored.conversation


async def get_response(response_id: str, stream: bool | None = None) -> Any:
    """A response as it stands: a running one (``queued`` or ``in_progress``,
    its output so far) or a stored one as it was sent.

    Raises:
        ApiError: 404 ``response_not_found``; 400 for ``stream=true`` (resuming
            a response's stream is not supported).
    """
    if stream:
        raise ApiError(
            "invalid_request",
            "resuming a response's stream is not supported; read the response without stream=true",
            param="stream",
        )
    store = current_store()
    running = store.running(response_id)
    if running is not None:
        return running.view(), 200, JSON
    stored = store.get(response_id)
    if stored is None:
        raise not_found(response_id, "response_id")
    return stored.response, 200, JSON


async def cancel_response(response_id: str) -> Any:
    """Cancel a background response and answer it as it ended (``cancelled``,
    or its final state when it had already finished: cancelling twice is
    harmless).

    Raises:
        ApiError: 404 ``response_not_found``; 400 for a response not created
            with ``background: true``.
    """
    store = current_store()
    running = store.running(response_id)
    background = running.background if running is not None else None
    if running is None:
        stored = store.get(response_id)
        if stored is None:
            raise not_found(response_id, "response_id")
        background = stored.response.get("background") is True
    if not background:
        raise ApiError(
            "invalid_request",
            "only responses created with background: true can be cancelled",
            param="response_id",
        )
    if running is not None:
        running.cancel()
        if running.done is not None:
            await asyncio.shield(running.done)
    stored = store.get(response_id)
    if stored is not None:
        return stored.response, 200, JSON
    if running is None:  # deleted (or evicted) meanwhile
        raise not_found(response_id, "response_id")
    # a background stream: its client sees the stream end; nothing is stored
    view = running.view()
    view["status"] = "cancelled"
    return view, 200, JSON


async def delete_response(response_id: str) -> Any:
    """Forget a stored response; later continuations from it answer 404.

    Raises:
        ApiError: 404 ``response_not_found``; 400 for a response still running.
    """
    store = current_store()
    if store.running(response_id) is not None:
        raise ApiError(
            "invalid_request",
            f"response '{response_id}' is still running; cancel it or let it finish first",
            param="response_id",
        )
    if not store.delete(response_id):
        raise not_found(response_id, "response_id")
    return {"id": response_id, "object": "response", "deleted": True}, 200, JSON


async def _frames(
    turn: Turn, builder: ResponseBuilder, keep: Callable[[], None]
) -> AsyncIterator[Frame]:
    """The stream's events; the response is stored before its terminal event
    goes out, so a client can continue from it as soon as it sees it."""
    for frame in builder.start():
        yield frame
    async for event in turn_events(turn):
        frames: Iterable[Frame] = builder.feed(event)
        if builder.response["status"] != "in_progress":
            keep()
        for frame in frames:
            yield frame


async def _listed(frames: AsyncIterator[Frame], end: Callable[[], None]) -> AsyncIterator[Frame]:
    """``frames``, then ``end()`` however they end (finished, failed, or the client left)."""
    try:
        async for frame in frames:
            yield frame
    finally:
        end()


def _stream_end(
    builder: ResponseBuilder, keep: Callable[[], None], store: ResponseStore, background: bool
) -> Callable[[], None]:
    """What ends a stored stream: it is no longer running; a background stream
    that stopped before its end (cancelled, or its client left) is stored as
    ``cancelled``, so ``GET`` and a repeated cancel still find it."""

    def end() -> None:
        if background and builder.response["status"] == "in_progress":
            builder.stop("cancelled")
            keep()
        store.end(builder.response["id"])

    return end


def _keeper(
    store: ResponseStore, conversation: Conversation, builder: ResponseBuilder, enabled: bool
) -> Callable[[], None]:
    """A callback that stores the finished response with its conversation
    extended by the assistant turn (text and tool calls; reasoning is not replayed)."""

    def keep() -> None:
        if not enabled:
            return
        reply = assistant_message(builder.output_text() or None, builder.tool_calls)
        extended = Conversation(
            conversation.instructions, conversation.system, (*conversation.messages, reply)
        )
        store.put(builder.response["id"], StoredResponse(builder.snapshot(), extended))

    return keep


def _skeleton(
    body: dict[str, Any], turn: Turn, conversation: Conversation, engine: EngineProtocol
) -> dict[str, Any]:
    """The response fields known before generation: ids and the echoed request."""
    sampling = turn.request.sampling
    return {
        "id": item_id("resp"),
        "object": "response",
        "created_at": now(),
        "completed_at": None,
        "model": engine.info.id,
        "error": None,
        "incomplete_details": None,
        "instructions": conversation.instructions,
        "max_output_tokens": turn.request.max_tokens,
        "parallel_tool_calls": body.get("parallel_tool_calls") is not False,
        "previous_response_id": body.get("previous_response_id"),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "tool_choice": body.get("tool_choice") or "auto",
        "tools": [t for t in body.get("tools") or () if t.get("type") == "function"],
        "store": body.get("store") is not False,
        "background": body.get("background") is True,
        "metadata": body.get("metadata") or {},
        "prompt_cache_key": body.get("prompt_cache_key"),
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "truncation": "disabled",
    }


def _token_counter(engine: EngineProtocol) -> Callable[[str], int]:
    """Tokens in a text by the served tokenizer, for ``reasoning_tokens``
    (the think markers themselves are not counted)."""

    def count(text: str) -> int:
        return engine.count_text_tokens(text)

    return count

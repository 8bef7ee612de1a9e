"""``/v1/responses``: OpenAI's Responses API on the chat path.

``POST /v1/responses`` (operationId ``createResponse``) translates the body
to a chat body (:mod:`.responses_input`), runs one chat turn, and answers the
turn folded into a Response object (:mod:`.responses_output`), as JSON or as
OpenAI's named stream events. A finished response (completed or incomplete,
never failed) is stored, with its conversation, unless ``store`` is false;
``previous_response_id`` continues from it. ``GET`` and ``DELETE
/v1/responses/{response_id}`` read and remove stored responses, as OpenAI's
API does. Errors use the OpenAI envelope.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from connexion.context import scope

from mlxspec import sse
from mlxspec.engine import Engine, PromptError
from mlxspec.errors import ApiError
from mlxspec.response_store import Conversation, ResponseStore, StoredResponse

from .common import JSON, current_engine, now
from .responses_input import assistant_message, to_chat_body
from .responses_output import Frame, ResponseBuilder, item_id, turn_as_events
from .turns import Turn, collect_turn, count_prompt, open_turn, turn_events


def current_store() -> ResponseStore:
    """The process's response store (placed in the ASGI scope by the app)."""
    return scope["state"]["response_store"]


def not_found(response_id: str, param: str) -> ApiError:
    """The 404 for a response id that is unknown, expired or deleted."""
    return ApiError(
        "response_not_found", f"response '{response_id}' not found or expired", param=param
    )


async def create_response(body: dict[str, Any]) -> Any:
    """Run one turn and answer a Response object, or its event stream.

    A ``text.format`` grammar (or a forced tool call's) that cannot be enforced
    runs unconstrained with a ``Warning`` header, as on chat completions
    (reference, "Structured output"; see :func:`~.turns.open_turn`).

    Raises:
        ApiError: 404 ``response_not_found`` for an unknown or expired
            ``previous_response_id``; 400 naming ``input`` for a prompt the
            template or the model cannot take; the chat path's engine errors.
    """
    engine, store = current_engine(), current_store()
    chat, conversation = to_chat_body(body, _previous(store, body))
    try:
        turn = await open_turn(engine, chat, prompt_param="input")
    except PromptError as exc:
        # its param indexes the translated chat messages, which the client never saw
        raise ApiError("invalid_request", exc.message, param="input") from exc
    builder = ResponseBuilder(_skeleton(body, turn, conversation, engine), _token_counter(engine))
    keep = _keeper(store, conversation, builder, body.get("store") is not False)
    if body.get("stream"):
        # Keep-alive comments fill silences (a withheld tool call, a long prefill).
        events = sse.with_keepalive(_frames(turn, builder, keep))
        frames = sse.named_events(events, builder.fail, on_close=turn.handle.cancel)
        response = sse.event_stream(frames)
        response.headers.update(turn.warning)
        return response
    result = await collect_turn(turn)
    for event in turn_as_events(result):
        builder.feed(event)
    keep()
    return builder.response, 200, {**JSON, **turn.warning}


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
        raise ApiError("invalid_request", exc.message, param="input") from exc
    return {"object": "response.input_tokens", "input_tokens": tokens}, 200, JSON


def _previous(store: ResponseStore, body: dict[str, Any]) -> Conversation | None:
    """The stored conversation ``previous_response_id`` names, or ``None`` without one.

    Raises:
        ApiError: 404 ``response_not_found`` for an unknown or expired id.
    """
    previous_id = body.get("previous_response_id")
    if previous_id is None:
        return None
    stored = store.get(previous_id)
    if stored is None:
        raise not_found(previous_id, "previous_response_id")
    return stored.conversation


async def get_response(response_id: str) -> Any:
    """A stored response, as it was sent.

    Raises:
        ApiError: 404 ``response_not_found``.
    """
    stored = current_store().get(response_id)
    if stored is None:
        raise not_found(response_id, "response_id")
    return stored.response, 200, JSON


async def delete_response(response_id: str) -> Any:
    """Forget a stored response; later continuations from it answer 404.

    Raises:
        ApiError: 404 ``response_not_found``.
    """
    if not current_store().delete(response_id):
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
    body: dict[str, Any], turn: Turn, conversation: Conversation, engine: Engine
) -> dict[str, Any]:
    """The response fields known before generation: ids and the echoed request."""
    sampling = turn.request.sampling
    return {
        "id": item_id("resp"),
        "object": "response",
        "created_at": now(),
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
        "metadata": body.get("metadata") or {},
        "prompt_cache_key": body.get("prompt_cache_key"),
        "text": {"format": (body.get("text") or {}).get("format") or {"type": "text"}},
        "truncation": "disabled",
    }


def _token_counter(engine: Engine) -> Callable[[str], int]:
    """Tokens in a text by the served tokenizer, for ``reasoning_tokens``
    (the think markers themselves are not counted)."""

    def count(text: str) -> int:
        return len(engine.tokenizer.encode(text, add_special_tokens=False))

    return count

"""The web chat's frames: client frames read and checked against the document.

A client frame is a JSON text message whose shape the OpenAPI document states
(``components/schemas/ChatSocketClientFrame``), as it states request bodies:
this module parses it with the same strict JSON reader as the HTTP bodies and
validates it with the same validator, so a malformed frame is answered with
the same words a malformed body gets (``'temperature': ...``), in an ``error``
frame, and the socket stays open.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

from mlxspec.errors import ApiError
from mlxspec.openapi import load_spec
from mlxspec.openapi.schema_errors import best_error
from mlxspec.openapi.validation import error_for, parse_json_body, validator_for

__all__ = ["FrameError", "dump_frame", "error_frame", "read_frame", "schema"]

#: The largest client frame read (an image paste is the big one); a larger one
#: is refused unparsed. uvicorn's own cap (``ws_max_size``) is 16 MiB.
MAX_FRAME_BYTES = 8 * 2**20


class FrameError(Exception):
    """A client frame that cannot be served; :attr:`error` is what the client is told."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.message)
        self.error = error


@functools.cache
def schema(name: str) -> dict[str, Any]:
    """The document's component schema ``name`` with every ``$ref`` inlined
    (the frame schemas point into ``GenerationParameters``; none is recursive)."""
    spec = load_spec()

    def target(ref: str) -> Any:
        node: Any = spec
        for part in ref.removeprefix("#/").split("/"):
            node = node[part]
        return node

    def inline(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                return inline(target(node["$ref"]))
            return {k: inline(v) for k, v in node.items()}
        if isinstance(node, list):
            return [inline(v) for v in node]
        return node

    return inline(spec["components"]["schemas"][name])


def read_frame(message: Mapping[str, Any]) -> dict[str, Any]:
    """A client frame from an ASGI ``websocket.receive`` message, checked.

    Args:
        message (dict): the ASGI message (``text`` or ``bytes``).

    Returns:
        dict: the frame, valid against ``ChatSocketClientFrame``.

    Raises:
        FrameError: a binary or oversized message, text that is not strict
            JSON, or a frame the schema refuses (``param`` names the field).
    """
    text = message.get("text")
    if text is None:
        raise FrameError(ApiError("invalid_request", "frames are JSON text messages, not binary"))
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_FRAME_BYTES:
        raise FrameError(ApiError("payload_too_large", f"frame exceeds {MAX_FRAME_BYTES} bytes"))
    try:
        frame = parse_json_body(raw)
    except ApiError as exc:
        raise FrameError(ApiError("invalid_json", exc.message.replace("body", "frame"))) from exc
    error = best_error(validator_for(schema("ChatSocketClientFrame")).iter_errors(frame))
    if error is not None:
        err = error_for(error)
        err.message = err.message.replace("request body", "frame")  # the body's words
        raise FrameError(err)
    return frame


def error_frame(err: ApiError) -> dict[str, Any]:
    """The ``error`` frame of ``err``: its message, the table's code, the field."""
    return {"type": "error", "message": err.message, "code": err.spec.code, "param": err.param}


def dump_frame(frame: dict[str, Any]) -> str:
    """A server frame as compact JSON text."""
    return json.dumps(frame, ensure_ascii=False, separators=(",", ":"))

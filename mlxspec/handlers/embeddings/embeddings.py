"""``POST /v1/embeddings`` (operationId ``createEmbedding``): OpenAI's list shape.

Only an embedding model serves it (``ModelInfo.embedding``); vectors come from
``engine.embed`` (:func:`mlxspec.engine.embed_texts`) and are sent as JSON
floats or, with ``encoding_format: base64``, as base64 of little-endian
float32 bytes (the OpenAI SDKs' default request); ``dimensions`` shortens
them (the leading dimensions, normalised again). The input tokens of a request
that got its vectors are counted in ``/metrics`` (``mlxspec_embedding_tokens_total``).
"""

from __future__ import annotations

import array
import base64
import sys
from collections.abc import Sequence
from typing import Any

from mlxspec.errors import ApiError
from mlxspec.handlers.adapters.select import check_model
from mlxspec.handlers.context import JSON, current_engine, current_metrics
from mlxspec.handlers.events import until_disconnect


async def create_embedding(body: dict[str, Any]) -> Any:
    """Embed ``input`` (a string, a list of strings, a list of token ids or a
    list of token-id lists) with the served model.

    Raises:
        ApiError: the served model is not an embedding model (param ``model``).
        PromptError: ``dimensions`` exceeds the model's embedding size.
        QueueFullError: ``--max-queue`` requests already wait (429 ``queue_full``).
    """
    engine = current_engine()
    check_model(engine, body.get("model"))
    if not engine.info.embedding:
        raise ApiError(
            "invalid_request",
            f"model '{engine.info.id}' is not an embedding model; serve an embedding model "
            "(e.g. Qwen3-Embedding) to use /v1/embeddings",
            param="model",
        )
    texts = _inputs(body["input"])
    # A place in the admission queue, as a generation takes (429 when full).
    with engine.hold("embedding"):
        result = await until_disconnect(
            engine.embed(texts, body.get("instruction"), body.get("dimensions"))
        )
    if (metrics := current_metrics()) is not None:
        metrics.embedding_tokens.inc(result.tokens)
    as_base64 = body.get("encoding_format") == "base64"
    data = [
        {"object": "embedding", "index": i, "embedding": encode_base64(v) if as_base64 else list(v)}
        for i, v in enumerate(result.vectors)
    ]
    usage = {"prompt_tokens": result.tokens, "total_tokens": result.tokens}
    return {"object": "list", "data": data, "model": engine.info.id, "usage": usage}, 200, JSON


def _inputs(raw: str | list[Any]) -> list[Any]:
    """The inputs of a validated ``input``: a string or one list of token ids
    is one input, otherwise each item (a text or a token-id list) is one.

    Raises:
        ApiError: token ids mixed with texts or token-id lists (``input[i]``).
    """
    if isinstance(raw, str) or all(isinstance(x, int) for x in raw):
        return [raw]
    mixed = next((i for i, x in enumerate(raw) if isinstance(x, int)), None)
    if mixed is not None:
        raise ApiError(
            "invalid_request",
            "`input` mixes token ids with other inputs: send one list of token ids, or a "
            "list of texts and token-id lists",
            param=f"input[{mixed}]",
        )
    return list(raw)


def encode_base64(vector: Sequence[float]) -> str:
    """``vector`` as base64 of little-endian float32 bytes (OpenAI's ``base64`` format).

    Args:
        vector (Sequence[float]): the embedding.

    Returns:
        str: what ``numpy.frombuffer(base64.b64decode(s), dtype="<f4")`` reads back.
    """
    packed = array.array("f", vector)
    if sys.byteorder == "big":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")

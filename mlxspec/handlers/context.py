"""What a handler knows of the request it serves, besides the body.

The app (:class:`mlxspec.http.app._WithEngine`) places the engine, the
server's configuration and its metrics in the request's ASGI scope; these
read them, and the request's headers, through Connexion's request context.
The stamps every reply carries (its id, creation time, the server's
fingerprint, the JSON ``Content-Type``) live here too.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from connexion.context import scope

from mlxspec import __version__
from mlxspec.engine import EngineProtocol
from mlxspec.errors import ApiError
from mlxspec.http.metrics import Metrics

#: The ``system_fingerprint`` of chat and text completions.
SYSTEM_FINGERPRINT = f"mlxspec-{__version__}"

#: The headers of a JSON reply (handlers return ``body, status, JSON``).
JSON = {"Content-Type": "application/json"}


def current_engine() -> EngineProtocol:
    """The engine serving this request.

    Raises:
        ApiError: 503 ``model_unavailable`` on a transcription-only server
            (``serve <whisper checkpoint>``: no chat engine).
    """
    engine = scope["state"]["engine"]
    if engine is None:
        raise ApiError("model_unavailable", "this server serves transcription only (no chat model)")
    return engine


def current_metrics() -> Metrics | None:
    """The app's metrics; ``None`` outside a request (unit tests drive handles
    directly) or in an app without metrics."""
    try:
        return scope["state"].get("metrics")
    except RuntimeError:  # connexion's context is unbound outside a request
        return None


def logprobs_format() -> str:
    """The server's ``--logprobs-format``: ``"mlx"`` (ServeConfig's default,
    also when the app has no config) or ``"openai"``."""
    config: Any = scope["state"].get("config")
    return getattr(config, "logprobs_format", None) or "mlx"


def stream_usage_always() -> bool:
    """Whether a chat or text completion stream puts ``usage`` on the chunk
    that finishes its last choice even unasked (``--stream-usage always``, the
    reference's behaviour); by default (``requested``) only the extra final
    chunk ``stream_options.include_usage`` asks for carries it (OpenAI's contract)."""
    config: Any = scope["state"].get("config")
    return getattr(config, "stream_usage", None) == "always"


def served_spec_names() -> tuple[bool, str | None]:
    """``(--strict-model, the model spec as the operator gave it)``; ``(False,
    None)`` outside a request or in an app without config."""
    try:
        config: Any = scope["state"].get("config")
    except RuntimeError:  # connexion's context is unbound outside a request
        return False, None
    return bool(getattr(config, "strict_model", False)), getattr(config, "model", None)


def request_headers() -> dict[str, str]:
    """The current request's headers, lower-case names (last value wins)."""
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope.get("headers", [])}


def new_id(prefix: str) -> str:
    """A response id such as ``chatcmpl-<uuid4>``."""
    return f"{prefix}-{uuid.uuid4()}"


def now() -> int:
    """Unix time in seconds, for ``created``."""
    return int(time.time())

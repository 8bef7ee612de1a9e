"""The ``--isolate`` parent's ASGI app: what it answers itself, and the proxy.

Answered here: ``GET /engine`` (reference, "Internal routes": ``isolated``,
``pid``, ``restarts``, ``socket``, ``response_store``: the counters of the
Responses store the parent keeps for its children, ``pool``), a ``404`` for the
worker routes ``/admin/drain`` and ``/admin/lease`` (never exposed on TCP), and,
under ``--model-pool``, ``GET /v1/models`` (the pool's models, ``resident``
marked). Everything else is proxied (:mod:`.proxy`): the generating routes to
the child their body's ``model`` names (:mod:`.routing`), the rest to the default
child, ``/ws/chat`` too. A child that cannot serve is a ``502 engine_unavailable``
in the path's surface's envelope.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
from typing import Any

from starlette.types import Receive, Scope, Send

from mlxspec.config import ServeConfig
from mlxspec.errors import ApiError, send_error
from mlxspec.handlers.responses.store import ResponseStore
from mlxspec.library import Registry
from mlxspec.supervisor.child import ChildState, ChildUnavailable
from mlxspec.supervisor.pool import Pool, keep_alive_seconds
from mlxspec.supervisor.proxy import forward_http, forward_websocket, unavailable
from mlxspec.supervisor.routing import ROUTED_PATHS

log = logging.getLogger("mlxspec.supervisor")

#: The worker-only routes (reference: "Never exposed on TCP").
WORKER_ROUTES = frozenset({"/admin/drain", "/admin/lease"})


class ParentApp:
    """The parent's ASGI app (lifespan starts and stops the children).

    Args:
        config (ServeConfig): the parent's settings (``api_key``, ``max_body_bytes``).
        pool (Pool): the children.
        store (ResponseStore | None): the Responses store the children share
            (``GET /engine``'s ``response_store``). Default: ``None``.
    """

    def __init__(self, config: ServeConfig, pool: Pool, store: ResponseStore | None = None) -> None:
        self.config, self.pool, self.store = config, pool, store
        self.library = Registry()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        elif scope["type"] == "http":
            await self._http(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.pool.start()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.pool.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        child = self.pool.children[self.pool.default]
        try:
            await self.pool.acquire(child)
        except ChildUnavailable:
            await receive()
            await send({"type": "websocket.close", "code": 1011})
            return
        try:
            await forward_websocket(scope, receive, send, child.socket)
        finally:
            self.pool.release(child)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope["path"], scope["method"]
        if path in WORKER_ROUTES:
            await send_error(scope, send, ApiError("not_found", "not found"))
            return
        if path == "/engine" and method == "GET":
            await self._own(scope, send, self.engine_status())
            return
        if path == "/api/hub/serve" and method == "POST":
            await self._hub_serve(scope, receive, send)
            return
        if path.startswith("/v1/models") and method == "GET" and len(self.pool.children) > 1:
            await self._models(scope, send, path)
            return
        body, requested, keep_alive = None, None, None
        if method == "POST" and path in ROUTED_PATHS:
            body = await _read_body(receive, self.config.max_body_bytes)
            if body is None:
                limit = self.config.max_body_bytes
                err = ApiError("payload_too_large", f"request body exceeds {limit} bytes")
                await send_error(scope, send, err, close=True)
                return
            requested, keep_alive = _model_fields(body)
            child = self.pool.pick(requested)
        elif method == "GET":
            child = self.pool.any_ready()
        else:
            child = self.pool.children[self.pool.default]
        try:
            client = await self.pool.acquire(child)
        except ChildUnavailable as exc:
            await send_error(scope, send, unavailable(str(exc)))
            return
        try:
            await forward_http(scope, receive, send, client, body)
        finally:
            self.pool.release(child, keep_alive)

    async def _hub_serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """``POST /api/hub/serve`` under ``--isolate``: a real swap of the pool's
        default (reference: the isolate pool's spawn-overlap swap), where a
        single-model server answers ``restart_required``."""
        body = await _read_body(receive, self.config.max_body_bytes)
        if not self._key_ok(scope):
            await self._own(scope, send, {})  # the 401
            return
        model = _json_field(body or b"", "model")
        if not isinstance(model, str) or not _servable_spec(model, self.pool.ids):
            message = "model must be a pool id or an 'org/name' repo id"
            await send_error(scope, send, ApiError("invalid_request", message, param="model"))
            return
        if model not in self.pool.ids and not await asyncio.to_thread(self._on_disk, model):
            message = f"{model} is not a servable model on disk: download it first"
            await send_error(scope, send, ApiError("not_found", message, param="model"))
            return
        default = self.pool.make_default(model)
        log.info("pool default is now %s", default)
        await self._own(scope, send, {"ok": True, "model": model, "default": default})

    async def _models(self, scope: Scope, send: Send, path: str) -> None:
        """``GET /v1/models`` (the pool) or ``GET /v1/models/<id>`` (its row, as a
        list, or a 404), answered without starting any child."""
        listing = self.models()
        if path == "/v1/models":  # the library's scan reads folders: off the loop
            listing["data"] += await asyncio.to_thread(self.library_models, listing["data"])
        else:
            wanted = path.removeprefix("/v1/models/")
            listing["data"] = [r for r in listing["data"] if r["id"] == wanted]
            if not listing["data"] and self._key_ok(scope):
                err = ApiError("not_found", f"model '{wanted}' not found", param="model_id")
                await send_error(scope, send, err)
                return
        await self._own(scope, send, listing)

    async def _own(self, scope: Scope, send: Send, payload: dict[str, Any]) -> None:
        """Answer ``payload`` (JSON) from the parent, behind the API key."""
        if not self._key_ok(scope):
            err = ApiError(
                "unauthorized",
                "a valid API key is required: send "
                "'Authorization: Bearer <key>' or 'x-api-key: <key>'",
            )
            await send_error(scope, send, err)
            return
        data = json.dumps(payload).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": data})

    def _key_ok(self, scope: Scope) -> bool:
        key = self.config.api_key
        if not key:
            return True
        for name, value in scope.get("headers", []):
            text = value.decode("latin-1")
            if name == b"authorization" and text.lower().startswith("bearer "):
                text = text[7:].strip()
            if name in (b"authorization", b"x-api-key") and hmac.compare_digest(
                text.encode(), key.encode()
            ):
                return True
        return False

    def engine_status(self) -> dict[str, Any]:
        """``GET /engine``: the default model's child (its fields ``null`` while
        it does not run; reading never starts it) and, with a pool, the pool."""
        child = self.pool.children[self.pool.default]
        running = child.state is not ChildState.STOPPED
        status: dict[str, Any] = {
            "isolated": True,
            "pid": child.pid,
            "restarts": child.restarts,
            "socket": child.socket if running else None,
            "state": child.state.value,
            "response_store": self.store.stats() if self.store is not None else None,
        }
        if child.error and child.state in (ChildState.DEAD, ChildState.FAILED):
            status["error"] = child.error
        if len(self.pool.children) > 1:
            status["pool"] = {
                "resident": self.pool.resident(),
                "default": self.pool.default,
                "models": self.pool.ids,
            }
        return status

    def _on_disk(self, model: str) -> bool:
        """Whether ``model`` is a servable chat model on disk (scanned again when
        the cached scan lacks it: it may have just been downloaded)."""
        row = self.library.find(model)
        if row is None:
            self.library.snapshot(refresh=True)
            row = self.library.find(model)
        return row is not None and row.chat

    def library_models(self, listed: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Every other servable model on disk (the library's scan), after the
        pool's rows: ``vision`` and ``tier`` as a direct server lists them."""
        created = listed[0]["created"] if listed else int(time.time())
        return self.library.model_rows(listed, created)

    def models(self) -> dict[str, Any]:
        """``GET /v1/models`` under a pool: one row per pool model, ``resident``
        marked (the default first)."""
        created = int(time.time())
        rows = [
            {
                "id": mid,
                "object": "model",
                "created": created,
                "owned_by": "mlxspec",
                "resident": child.resident,
            }
            for mid, child in self.pool.children.items()
        ]
        return {"object": "list", "data": rows}


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body (routing reads its ``model``); ``None`` over ``limit``."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _json_field(body: bytes, name: str) -> object:
    """A JSON object body's ``name`` field; ``None`` otherwise."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    return data.get(name) if isinstance(data, dict) else None


def _servable_spec(model: str, ids: list[str]) -> bool:
    """A pool id, or a plain ``org/name`` repo id (resolved from the local
    cache by the child; never a path a client names)."""
    from mlxspec.library import PathRefused, check_repo_id

    if model in ids:
        return True
    try:
        check_repo_id(model)
    except PathRefused:
        return False
    return True


def _model_fields(body: bytes) -> tuple[object, float | None]:
    """A JSON body's ``model`` and ``keep_alive`` (seconds); ``(None, None)`` for
    a body that is not a JSON object (the child answers it)."""
    try:
        data = json.loads(body)
    except ValueError:
        return None, None
    if not isinstance(data, dict):
        return None, None
    return data.get("model"), keep_alive_seconds(data.get("keep_alive"))


async def get_engine() -> Any:
    """The document's ``getEngine`` operation: answered by :class:`ParentApp`
    itself, never through Connexion (a direct server has no such route)."""
    raise ApiError("not_found", "not found")

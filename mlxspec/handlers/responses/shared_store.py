"""The Responses store shared over a process boundary: under ``--isolate`` the
parent owns the finished responses, so a child that restarts or is evicted
keeps every ``previous_response_id`` chain (reference, "Under ``--isolate``, the
parent owns Responses continuation history").

- :class:`StoreServer` (the parent): one :class:`~.store.ResponseStore`, served
  on a unix socket of the parent's private 0700 directory by
  :mod:`multiprocessing.connection` (its HMAC handshake with a random key the
  children read from their 0600 settings file), a thread per child.
- :class:`RemoteStore` (a child): the store the child's handlers use. Responses
  still running stay local (they live in this process: how to read and cancel
  them); finished ones are put, read and deleted in the parent's store.

Each message is one JSON document (never a pickle): ``{"op": "put", "id",
"entry"}``, ``{"op": "get", "id"}``, ``{"op": "delete", "id"}``, ``{"op":
"stats"}``; the answer ``{"value": ...}``. A call is a round trip of about a
millisecond on the child's event loop, once per stored response and once per
continuation.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from mlxspec.errors import ApiError
from mlxspec.handlers.responses.store import Conversation, ResponseStore, StoredResponse

__all__ = ["RemoteStore", "StoreServer", "decode_entry", "encode_entry", "process_store"]

log = logging.getLogger("mlxspec.responses")

#: Seconds a child waits for the parent's answer before giving up on the call.
CALL_TIMEOUT_S = 10.0


def encode_entry(entry: StoredResponse) -> dict[str, Any]:
    """``entry`` as JSON-ready data (:func:`decode_entry` reads it back)."""
    conv = entry.conversation
    return {
        "response": entry.response,
        "instructions": conv.instructions,
        "system": list(conv.system),
        "messages": list(conv.messages),
    }


def decode_entry(data: dict[str, Any]) -> StoredResponse:
    """The :class:`~.store.StoredResponse` :func:`encode_entry` wrote.

    Raises:
        KeyError, TypeError: ``data`` is not such a document.
    """
    conversation = Conversation(
        data["instructions"], tuple(data["system"]), tuple(data["messages"])
    )
    return StoredResponse(data["response"], conversation)


class StoreServer:
    """The parent's store, served to its children on ``address``.

    Args:
        address (str): the unix socket's path (in a private directory).
        store (ResponseStore | None): the store. Default: a new one with the
            reference's TTL and byte cap.

    Attributes:
        key (str): the hex handshake key a child needs (:class:`RemoteStore`).
    """

    def __init__(self, address: str, store: ResponseStore | None = None) -> None:
        self.address, self.store = address, store or ResponseStore()
        self.key = secrets.token_hex(32)
        self._listener = Listener(address, "AF_UNIX", authkey=bytes.fromhex(self.key))
        os.chmod(address, 0o600)
        self._closed = False
        threading.Thread(target=self._accept, name="mlxspec-response-store", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except OSError:  # closed
                return
            except Exception as exc:  # a bad handshake: refused, the server goes on
                log.warning("response store: connection refused (%s)", type(exc).__name__)
                continue
            name = "mlxspec-response-store-conn"
            threading.Thread(target=self._serve, args=(conn,), name=name, daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    request = json.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    return
                except ValueError:
                    log.warning("response store: a message that is not JSON; connection closed")
                    return
                try:
                    answer = {"value": self.answer(request)}
                except (KeyError, TypeError, ValueError) as exc:
                    answer = {"error": f"bad request: {type(exc).__name__}"}
                try:
                    conn.send_bytes(json.dumps(answer).encode())
                except OSError:
                    return

    def answer(self, request: dict[str, Any]) -> Any:
        """The value answering one decoded request (see the module).

        Raises:
            KeyError, TypeError, ValueError: not a request of this protocol.
        """
        op = request["op"]
        if op == "put":
            return self.store.put(str(request["id"]), decode_entry(request["entry"]))
        if op == "get":
            entry = self.store.get(str(request["id"]))
            return None if entry is None else encode_entry(entry)
        if op == "delete":
            return self.store.delete(str(request["id"]))
        if op == "stats":
            return self.store.stats()
        raise ValueError(op)

    def close(self) -> None:
        """Stop accepting children (the connections end with the process)."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()


class RemoteStore(ResponseStore):
    """A child's store: running responses here, finished ones in the parent's.

    Args:
        address (str): the parent's store socket.
        key (str): its hex handshake key.

    A call the parent does not answer (it is gone or stuck) makes a ``put``
    return ``False`` (the answer was sent; the chain cannot be continued) and a
    read or delete raise ``502 engine_unavailable``.
    """

    def __init__(self, address: str, key: str) -> None:
        super().__init__()
        self.address, self._key = address, bytes.fromhex(key)
        self._conn: Connection | None = None
        self._call_lock = threading.Lock()

    def _call(self, request: dict[str, Any]) -> Any:
        """One round trip to the parent (reconnecting once after a broken link).

        Raises:
            ApiError: 502 ``engine_unavailable``: no answer.
        """
        with self._call_lock:
            for attempt in (1, 2):
                try:
                    if self._conn is None:
                        self._conn = Client(self.address, "AF_UNIX", authkey=self._key)
                    self._conn.send_bytes(json.dumps(request).encode())
                    if not self._conn.poll(CALL_TIMEOUT_S):
                        raise TimeoutError
                    answer = json.loads(self._conn.recv_bytes())
                    break
                except (OSError, EOFError, TimeoutError, ValueError, AuthenticationError) as exc:
                    self._disconnect()
                    if attempt == 2 or isinstance(exc, TimeoutError | AuthenticationError):
                        raise ApiError(
                            "engine_unavailable",
                            "the response store (the --isolate parent) is unavailable",
                        ) from exc
        if "error" in answer:
            raise ApiError("server_error", f"response store: {answer['error']}")
        return answer["value"]

    def _disconnect(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
            self._conn = None

    def put(self, response_id: str, value: StoredResponse) -> bool:
        """Store ``value`` in the parent; ``False`` when it is too large or the
        parent did not answer (logged)."""
        if value.size() > self.max_bytes:
            return False
        try:
            return bool(self._call({"op": "put", "id": response_id, "entry": encode_entry(value)}))
        except ApiError:
            log.error("response %s not stored: the parent's store did not answer", response_id)
            return False

    def get(self, response_id: str) -> StoredResponse | None:
        """The parent's entry for ``response_id``, or ``None``.

        Raises:
            ApiError: 502 ``engine_unavailable`` (the parent did not answer).
        """
        data = self._call({"op": "get", "id": response_id})
        return None if data is None else decode_entry(data)

    def delete(self, response_id: str) -> bool:
        """Remove ``response_id`` from the parent's store.

        Raises:
            ApiError: 502 ``engine_unavailable`` (the parent did not answer).
        """
        return bool(self._call({"op": "delete", "id": response_id}))

    def stats(self) -> dict[str, int]:
        """The parent's counters (``{"entries", "bytes", "max_bytes", "ttl_ms"}``).

        Raises:
            ApiError: 502 ``engine_unavailable`` (the parent did not answer).
        """
        return dict(self._call({"op": "stats"}))


def process_store(address: str | None, key: str | None) -> ResponseStore:
    """A server process's Responses store: a :class:`RemoteStore` on the parent's
    ``address`` in an ``--isolate`` child (both set), else a store of its own."""
    if address and key:
        return RemoteStore(address, key)
    return ResponseStore()

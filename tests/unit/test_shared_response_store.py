"""The Responses store shared over a unix socket (issue 29: under ``--isolate``
the parent owns it): a child's :class:`RemoteStore` puts, reads and deletes in
the parent's :class:`StoreServer`; a wrong key is refused; a gone parent is a
502 ``engine_unavailable``, never a hang (in-process: threads, no process)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from mlxspec.errors import ApiError
from mlxspec.handlers.responses.shared_store import (
    RemoteStore,
    StoreServer,
    decode_entry,
    encode_entry,
    process_store,
)
from mlxspec.handlers.responses.store import Conversation, ResponseStore, Running, StoredResponse


def entry(text: str = "hi", reply: str = "hello") -> StoredResponse:
    messages = ({"role": "user", "content": text}, {"role": "assistant", "content": reply})
    response = {"id": "resp_1", "object": "response", "output": [{"type": "message"}]}
    return StoredResponse(response, Conversation("be brief", ("sys",), messages))


@pytest.fixture
def server(tmp_path: Path) -> Iterator[StoreServer]:
    served = StoreServer(str(tmp_path / "responses.sock"))
    yield served
    served.close()


def test_an_entry_survives_the_json_wire_format() -> None:
    value = entry("é ✓")
    again = decode_entry(encode_entry(value))
    assert again == value and again.size() == value.size()


def test_a_child_store_keeps_finished_responses_in_the_parent(server: StoreServer) -> None:
    child = RemoteStore(server.address, server.key)
    value = entry()
    assert child.put("resp_1", value) is True
    assert server.store.get("resp_1") == value  # the parent holds it
    assert child._entries == {}  # and the child nothing
    assert child.get("resp_1") == value
    assert child.stats() == server.store.stats() and child.stats()["entries"] == 1


def test_a_new_child_reads_what_a_dead_one_stored(server: StoreServer) -> None:
    first = RemoteStore(server.address, server.key)
    first.put("resp_1", entry())
    first._disconnect()  # the child process is gone
    second = RemoteStore(server.address, server.key)
    assert second.get("resp_1") == entry()
    assert second.delete("resp_1") is True
    assert first.get("resp_1") is None and first.delete("resp_1") is False


def test_running_responses_stay_in_the_child(server: StoreServer) -> None:
    child = RemoteStore(server.address, server.key)
    running = Running(view=lambda: {"status": "in_progress"}, cancel=lambda: None)
    child.begin("resp_2", running)
    assert child.running("resp_2") is running
    assert server.store.running("resp_2") is None
    child.end("resp_2")
    assert child.running("resp_2") is None


def test_an_entry_over_the_cap_is_not_sent(server: StoreServer) -> None:
    child = RemoteStore(server.address, server.key)
    child.max_bytes = entry().size() - 1
    assert child.put("resp_1", entry()) is False
    assert server.store.stats()["entries"] == 0


def test_a_wrong_key_is_refused_and_the_server_goes_on(server: StoreServer) -> None:
    intruder = RemoteStore(server.address, "00" * 32)
    with pytest.raises(ApiError) as refused:
        intruder.get("resp_1")
    assert refused.value.kind == "engine_unavailable" and refused.value.spec.status == 502
    assert intruder.put("resp_1", entry()) is False
    child = RemoteStore(server.address, server.key)
    assert child.put("resp_1", entry()) is True and child.get("resp_1") == entry()


def test_a_request_outside_the_protocol_is_an_error_answer(server: StoreServer) -> None:
    with pytest.raises(ValueError):
        server.answer({"op": "drop_all"})
    child = RemoteStore(server.address, server.key)
    with pytest.raises(ApiError) as bad:
        child._call({"op": "put", "id": "resp_1", "entry": {"response": {}}})
    assert bad.value.kind == "server_error"
    assert child.stats()["entries"] == 0  # the connection still serves


def test_a_gone_parent_is_a_502_not_a_hang(tmp_path: Path) -> None:
    served = StoreServer(str(tmp_path / "responses.sock"))
    child = RemoteStore(served.address, served.key)
    assert child.put("resp_1", entry()) is True
    served.close()
    (tmp_path / "responses.sock").unlink(missing_ok=True)
    child._disconnect()
    with pytest.raises(ApiError) as gone:
        child.get("resp_1")
    assert gone.value.kind == "engine_unavailable"
    assert child.put("resp_2", entry()) is False


def test_the_socket_is_private(server: StoreServer) -> None:
    assert Path(server.address).stat().st_mode & 0o777 == 0o600
    assert len(bytes.fromhex(server.key)) == 32


def test_a_process_gets_the_parents_store_only_with_both_settings(server: StoreServer) -> None:
    assert isinstance(process_store(server.address, server.key), RemoteStore)
    for address, key in ((None, None), (server.address, None), (None, server.key)):
        store = process_store(address, key)
        assert type(store) is ResponseStore

"""The Responses store: TTL expiry, byte-capped LRU eviction, stats (pure, injectable clock)."""

from __future__ import annotations

from mlxspec.handlers.responses.store import Conversation, ResponseStore, StoredResponse


class Clock:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def entry(text: str = "hi") -> StoredResponse:
    messages = ({"role": "user", "content": text},)
    return StoredResponse({"id": "resp_x", "object": "response"}, Conversation("sys", (), messages))


def test_get_returns_what_was_put_and_stats_count_it() -> None:
    store = ResponseStore(clock=Clock())
    value = entry()
    assert store.put("resp_1", value) is True
    assert store.get("resp_1") is value
    assert store.get("resp_2") is None
    assert store.stats() == {
        "entries": 1,
        "bytes": value.size(),
        "max_bytes": 32 * 1024 * 1024,
        "ttl_ms": 3_600_000,
    }


def test_size_is_the_utf8_json_length() -> None:
    # '[{"id": "resp_x", "object": "response"}, "sys", [], [{"role": "user", "content": "é"}]]'
    assert entry("é").size() == 88
    assert entry("é").size() == entry("e").size() + 1


def test_entries_expire_after_the_ttl_even_when_read() -> None:
    clock = Clock()
    store = ResponseStore(ttl_s=10, clock=clock)
    store.put("resp_1", entry())
    clock.now += 9.999
    assert store.get("resp_1") is not None  # a read does not extend the lifetime
    clock.now += 0.001
    assert store.get("resp_1") is None
    assert store.stats()["entries"] == 0 and store.stats()["bytes"] == 0


def test_stats_do_not_count_expired_entries() -> None:
    clock = Clock()
    store = ResponseStore(ttl_s=10, clock=clock)
    store.put("resp_1", entry())
    clock.now += 5
    store.put("resp_2", entry())
    clock.now += 6
    assert store.stats()["entries"] == 1
    assert store.get("resp_2") is not None


def test_least_recently_used_entries_are_evicted_by_bytes() -> None:
    size = entry().size()
    store = ResponseStore(max_bytes=3 * size, clock=Clock())
    for key in ("resp_1", "resp_2", "resp_3"):
        store.put(key, entry())
    assert store.get("resp_1") is not None  # now most recently used
    store.put("resp_4", entry())
    assert store.get("resp_2") is None
    assert [k for k in ("resp_1", "resp_3", "resp_4") if store.get(k)] == [
        "resp_1",
        "resp_3",
        "resp_4",
    ]
    assert store.stats()["bytes"] == 3 * size


def test_a_big_entry_evicts_as_many_as_needed() -> None:
    small = entry()
    big = entry("x" * (2 * small.size()))
    store = ResponseStore(max_bytes=big.size() + small.size(), clock=Clock())
    for key in ("resp_1", "resp_2", "resp_3"):
        store.put(key, small)
    store.put("resp_big", big)
    assert store.get("resp_1") is None and store.get("resp_2") is None
    assert store.get("resp_3") is small and store.get("resp_big") is big


def test_an_entry_larger_than_the_cap_is_refused_without_evicting() -> None:
    store = ResponseStore(max_bytes=entry().size(), clock=Clock())
    store.put("resp_1", entry())
    assert store.put("resp_2", entry("much longer text")) is False
    assert store.get("resp_1") is not None and store.get("resp_2") is None


def test_replacing_an_id_keeps_the_byte_count_exact() -> None:
    store = ResponseStore(clock=Clock())
    store.put("resp_1", entry("a"))
    store.put("resp_1", entry("bbbb"))
    assert store.stats()["entries"] == 1
    assert store.stats()["bytes"] == entry("bbbb").size()


def test_delete() -> None:
    store = ResponseStore(clock=Clock())
    store.put("resp_1", entry())
    assert store.delete("resp_1") is True
    assert store.delete("resp_1") is False
    assert store.get("resp_1") is None and len(store) == 0

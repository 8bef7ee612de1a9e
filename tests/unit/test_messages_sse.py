"""Anthropic framing in :mod:`mlxspec.http.sse`: named events at the byte level, and
a hypothesis property that any payloads come back unchanged, with their event
names, from the ``anthropic`` SDK's own SSE decoder under any split of the bytes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from anthropic._streaming import SSEDecoder
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlxspec.conformance.anthropic_contract import split_named_events
from mlxspec.errors import ApiError
from mlxspec.http import sse

PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Characters that break line-based parsers if written raw.
tricky = st.text(st.sampled_from('\n\r\u2028\u2029\x85\x0b\x0c\u00e9\U0001f600:\\" '))
names = st.sampled_from(["message_start", "content_block_delta", "message_stop", "ping"])
payloads = st.builds(
    lambda name, fields: {"type": name, **fields},
    names,
    st.dictionaries(st.text(max_size=4).filter(lambda k: k != "type"), tricky, max_size=3),
)


def run(items: list[dict], fail_with: Exception | None = None) -> tuple[bytes, list[str]]:
    closed: list[str] = []

    async def source() -> AsyncIterator[dict]:
        for item in items:
            yield item
        if fail_with is not None:
            raise fail_with

    async def collect() -> bytes:
        frames = sse.anthropic_events(source(), on_close=lambda: closed.append("closed"))
        return b"".join([frame async for frame in frames])

    return asyncio.run(collect()), closed


def test_named_frame_bytes() -> None:
    assert sse.named_frame("ping", {"type": "ping"}) == b'event: ping\ndata: {"type":"ping"}\n\n'
    frame = sse.named_frame("content_block_delta", {"text": "a\u2028b\u00e9"})
    assert frame == b'event: content_block_delta\ndata: {"text":"a\\u2028b\xc3\xa9"}\n\n'


def test_stream_is_named_by_type_and_has_no_done() -> None:
    body, closed = run([{"type": "message_start", "n": 1}, {"type": "message_stop"}])
    assert body == (
        b'event: message_start\ndata: {"type":"message_start","n":1}\n\n'
        b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    )
    assert closed == ["closed"]


def test_keepalive_bytes_pass_through() -> None:
    body, _ = run([{"type": "ping"}, sse.KEEPALIVE])  # type: ignore[list-item]
    assert body == b'event: ping\ndata: {"type":"ping"}\n\n' + sse.KEEPALIVE
    assert split_named_events(body) == [("ping", '{"type":"ping"}')]


def test_api_error_mid_stream_is_an_anthropic_error_event() -> None:
    body, closed = run([{"type": "ping"}], ApiError("queue_full", "generation queue is full"))
    assert body.endswith(
        b"event: error\n"
        b'data: {"type":"error","error":{"type":"rate_limit_error",'
        b'"message":"generation queue is full"}}\n\n'
    )
    assert closed == ["closed"]


def test_unexpected_exception_never_leaks_its_text() -> None:
    body, closed = run([], RuntimeError("secret path /home/x"))
    assert body == (
        b"event: error\n"
        b'data: {"type":"error","error":{"type":"api_error","message":"internal server error"}}\n\n'
    )
    assert closed == ["closed"]


@PROPERTY
@given(items=st.lists(payloads, max_size=5), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_stream_round_trips_through_the_anthropic_decoder_for_any_split(
    items: list[dict[str, Any]], cuts: list[int]
) -> None:
    body, _ = run(items)
    if not items:
        assert body == b""
        return
    bounds = sorted({0, len(body), *(c % (len(body) + 1) for c in cuts)})
    pieces = [body[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    events = list(SSEDecoder().iter_bytes(iter(pieces)))
    assert [(e.event, json.loads(e.data)) for e in events] == [(i["type"], i) for i in items]
    assert [(n, json.loads(d)) for n, d in split_named_events(body)] == [
        (i["type"], i) for i in items
    ]

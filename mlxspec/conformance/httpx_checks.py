"""Contract checks inside httpx: every response a client receives is checked.

:func:`checking_client` / :func:`checking_async_client` build httpx clients
whose response hook runs :func:`mlxspec.conformance.contract.check_response`:
status and headers as soon as they arrive, the body once it has been read to
its end (a stream the caller abandons early is not body-checked). The official
``openai`` SDK accepts these clients as ``http_client``; the ``anthropic`` SDK
(2.x) takes clients of ``httpx2``, a fork with httpx's API, built by passing
``http=httpx2``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from types import ModuleType
from typing import Any

import httpx

from mlxspec.conformance.contract import check_response

__all__ = ["async_check_hook", "check_hook", "checking_async_client", "checking_client"]


def _module(response: Any) -> ModuleType:
    """The httpx-compatible package a response comes from (``httpx`` or ``httpx2``)."""
    return sys.modules[type(response).__module__.partition(".")[0]]


def _check_exchange(response: httpx.Response, body: bytes | None) -> None:
    request = response.request
    try:
        request_body: bytes | None = request.content
    except _module(response).RequestNotRead:
        request_body = None
    if response.headers.get("content-encoding", "identity") != "identity":
        body = None  # raw bytes are still encoded; mlxspec never compresses
    check_response(
        request.method,
        request.url.raw_path.decode("ascii"),
        request_body,
        response.status_code,
        response.headers,
        body,
    )


class _RecordingStream:
    """Pass the body through; check the exchange once it has been read to the end.

    Only the first pass is recorded: the openai SDK drains ``response.stream``
    again after a stream ends, which yields nothing.
    """

    def __init__(self, inner: Any, done: Callable[[bytes], None]) -> None:
        self.inner, self.done, self.started = inner, done, False

    def __iter__(self) -> Iterator[bytes]:
        first, self.started, chunks = not self.started, True, []
        for chunk in self.inner:
            chunks.append(chunk)
            yield chunk
        if first:
            self.done(b"".join(chunks))

    def close(self) -> None:
        self.inner.close()


class _AsyncRecordingStream:
    """Async twin of :class:`_RecordingStream`."""

    def __init__(self, inner: Any, done: Callable[[bytes], None]) -> None:
        self.inner, self.done, self.started = inner, done, False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        first, self.started, chunks = not self.started, True, []
        async for chunk in self.inner:
            chunks.append(chunk)
            yield chunk
        if first:
            self.done(b"".join(chunks))

    async def aclose(self) -> None:
        await self.inner.aclose()


@functools.cache
def _stream_types(module: ModuleType) -> tuple[type, type]:
    """The recording streams as byte streams of ``module``: a client only
    iterates streams of its own package's base classes."""
    sync = type("RecordingStream", (_RecordingStream, module.SyncByteStream), {})
    async_ = type("AsyncRecordingStream", (_AsyncRecordingStream, module.AsyncByteStream), {})
    return sync, async_


def check_hook(response: httpx.Response) -> None:
    """httpx response hook: check status and headers now, the body once read.

    A body the caller stops reading early (a cancelled stream) is not checked.
    """
    if response.is_stream_consumed:  # e.g. httpx.MockTransport's pre-read responses
        _check_exchange(response, response.content)
        return
    _check_exchange(response, None)
    recording = _stream_types(_module(response))[0]
    response.stream = recording(response.stream, lambda b: _check_exchange(response, b))


async def async_check_hook(response: httpx.Response) -> None:
    """:func:`check_hook` for ``httpx.AsyncClient``."""
    if response.is_stream_consumed:
        _check_exchange(response, response.content)
        return
    _check_exchange(response, None)
    recording = _stream_types(_module(response))[1]
    response.stream = recording(response.stream, lambda b: _check_exchange(response, b))


def checking_client(base_url: str = "", *, http: ModuleType = httpx, **kwargs: Any) -> httpx.Client:
    """An ``httpx.Client`` that checks every response against the document.

    Args:
        base_url (str): e.g. ``http://127.0.0.1:8080``. Default: ``""``.
        http (ModuleType): the httpx-compatible package whose ``Client`` to
            build (``httpx2`` for the anthropic SDK 2.x). Default: ``httpx``.
        **kwargs: passed to ``Client`` (``timeout``, ...).

    Returns:
        httpx.Client: raises :class:`ContractViolation` from the call (or from
        reading the body) that received a non-conforming response.
    """
    return http.Client(base_url=base_url, event_hooks={"response": [check_hook]}, **kwargs)


def checking_async_client(
    base_url: str = "", *, http: ModuleType = httpx, **kwargs: Any
) -> httpx.AsyncClient:
    """:func:`checking_client` for asyncio (``AsyncClient``)."""
    return http.AsyncClient(
        base_url=base_url, event_hooks={"response": [async_check_hook]}, **kwargs
    )

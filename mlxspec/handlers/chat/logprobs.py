"""Logprobs on the wire, in the server's ``--logprobs-format``.

``mlx`` (the default, for parity) is ``mlx_lm.server``'s block on non-streamed
choices only (:func:`logprobs_block`). ``openai`` is OpenAI's shapes:
chat's ``{"content": [{token, logprob, bytes, top_logprobs}], "refusal"}`` and
the legacy completions lists ``{tokens, token_logprobs, top_logprobs,
text_offset}``, on stream chunks too. Token texts there are what each token
decodes to on its own; a token that is only part of a UTF-8 character is
written ``bytes:\\xNN...`` as OpenAI does, with its raw values in ``bytes``;
the stopping EOS token is left out, as OpenAI never reports it, and so are
the tokens of a stop string that ended the output (``TokenLogprob.in_content``:
a token part of whose text is in the content stays). mlx-lm's block keeps
them all: one entry per counted completion token.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from mlxspec.engine import GenerationRequest, TokenLogprob, TopLogprob

#: The ``--logprobs-format`` values (:func:`mlxspec.handlers.context.logprobs_format`).
MLX, OPENAI = "mlx", "openai"


def wanted(request: GenerationRequest) -> bool:
    """Whether the request asked for logprobs (``logprobs: true`` or ``top_logprobs`` k > 0)."""
    return request.logprobs or request.top_logprobs > 0


def token_text(raw: bytes) -> str:
    """A token's text for OpenAI's shapes.

    Args:
        raw (bytes): the token's bytes.

    Returns:
        str: ``raw`` decoded as UTF-8, or, when it is not valid UTF-8 on its
        own (part of a multi-byte character), ``"bytes:"`` followed by a
        ``\\xNN`` escape per byte (OpenAI's convention).
    """
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _openai_top(t: TopLogprob) -> dict[str, Any]:
    return {"token": token_text(t.token_bytes), "logprob": t.logprob, "bytes": list(t.token_bytes)}


def _openai_entry(e: TokenLogprob) -> dict[str, Any]:
    return {
        "token": token_text(e.token_bytes),
        "logprob": e.logprob,
        "bytes": list(e.token_bytes),
        "top_logprobs": [_openai_top(t) for t in e.top],
    }


def chat_logprobs(
    request: GenerationRequest, entries: Sequence[TokenLogprob], fmt: str
) -> dict[str, Any] | None:
    """A non-streamed chat choice's ``logprobs``.

    Args:
        request (GenerationRequest): the choice's engine request.
        entries (Sequence[TokenLogprob]): one per generated token.
        fmt (str): ``"mlx"`` or ``"openai"``.

    Returns:
        dict | None: ``None`` unless requested; else the block in ``fmt``.
    """
    if not wanted(request):
        return None
    if fmt == OPENAI:
        return {"content": [_openai_entry(e) for e in entries if e.in_content], "refusal": None}
    return logprobs_block(list(entries), request.top_logprobs)


def chat_chunk_logprobs(
    request: GenerationRequest, entries: Sequence[TokenLogprob], fmt: str
) -> dict[str, Any] | None:
    """A chat stream chunk's ``logprobs``: OpenAI's shape over the chunk's
    tokens in the ``openai`` format, else ``None`` (mlx-lm streams none)."""
    entries = [e for e in entries if e.in_content]
    if fmt != OPENAI or not wanted(request) or not entries:
        return None
    return {"content": [_openai_entry(e) for e in entries], "refusal": None}


class CompletionLogprobs:
    """Builds OpenAI's legacy completion logprobs, keeping ``text_offset``
    running across the stream chunks of one choice.

    Args:
        request (GenerationRequest): the choice's engine request.
        fmt (str): ``"mlx"`` or ``"openai"``.
    """

    def __init__(self, request: GenerationRequest, fmt: str) -> None:
        self.request, self.fmt = request, fmt
        self._offset = 0
        # Counts whole characters only, so a token that starts inside a
        # multi-byte character gets that character's offset.
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def whole(self, entries: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """A non-streamed choice's ``logprobs``: ``None`` unless requested,
        mlx-lm's block in the ``mlx`` format, OpenAI's legacy lists otherwise."""
        if not wanted(self.request):
            return None
        if self.fmt == OPENAI:
            return self._legacy([e for e in entries if e.in_content])
        return logprobs_block(list(entries), self.request.top_logprobs)

    def chunk(self, entries: Sequence[TokenLogprob]) -> dict[str, Any] | None:
        """A stream chunk's ``logprobs`` (``openai`` format only, else ``None``)."""
        entries = [e for e in entries if e.in_content]
        if self.fmt != OPENAI or not wanted(self.request) or not entries:
            return None
        return self._legacy(entries)

    def _legacy(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        offsets = []
        for e in entries:
            offsets.append(self._offset)
            self._offset += len(self._decoder.decode(e.token_bytes))
        top = None
        if self.request.top_logprobs > 0:
            top = [{token_text(t.token_bytes): t.logprob for t in e.top} for e in entries]
        return {
            "tokens": [token_text(e.token_bytes) for e in entries],
            "token_logprobs": [e.logprob for e in entries],
            "top_logprobs": top,
            "text_offset": offsets,
        }


def logprobs_block(entries: list[TokenLogprob], top_logprobs: int) -> dict[str, Any]:
    """mlx_lm.server's logprobs block (``generate_response``).

    With ``top_logprobs > 0`` each entry is the top-1 candidate merged with
    the sorted top list (mlx-lm's ``dict(top[0], top_logprobs=top)``);
    otherwise ``{id, logprob}`` of each generated token.
    """
    if top_logprobs > 0:
        content = []
        for e in entries:
            top = [{"id": t.id, "token": t.token, "logprob": t.logprob} for t in e.top]
            content.append(dict(top[0], top_logprobs=top) if top else {})
        return {"content": content}
    return {"content": [{"id": e.id, "logprob": e.logprob} for e in entries]}

"""Parser deltas and the two base classes (tool calls, reasoning).

A parser turns the model's decoded text, fed in arbitrary chunks, into a small
tagged union of deltas. Feeding the same text in any chunking yields deltas
whose concatenation per kind is the same (the property the tests check).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar


@dataclass(frozen=True)
class Content:
    """Visible answer text."""

    text: str


@dataclass(frozen=True)
class Reasoning:
    """Thinking-channel text."""

    text: str


@dataclass(frozen=True)
class CallBegin:
    """A tool call starts; its name is known."""

    name: str


@dataclass(frozen=True)
class CallArguments:
    """A fragment of the current call's arguments JSON text."""

    fragment: str


@dataclass(frozen=True)
class CallEnd:
    """The current call's arguments are complete."""


ParserDelta = Content | Reasoning | CallBegin | CallArguments | CallEnd


def held_prefix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``.

    That many characters must be held back: the next chunk may complete the marker.

    Args:
        text (str): buffered text.
        marker (str): the marker being looked for.

    Returns:
        int: characters to hold back (``0`` when no suffix could start the marker).
    """
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """Splits output into a thinking channel and content by a marker pair.

    Subclasses set ``start`` and ``end``. Text between them is reasoning; a
    template that already opened the channel in the generation prompt starts
    the parser inside it (``thinking=True``). Whitespace right after the end
    marker is dropped (templates put a blank line there).

    Args:
        thinking (bool): the prompt ends inside an open thinking channel.
            Default: ``False``.
    """

    name: ClassVar[str] = ""
    start: ClassVar[str] = "<think>"
    end: ClassVar[str] = "</think>"

    def __init__(self, thinking: bool = False) -> None:
        self.thinking = thinking
        self._buffer = ""
        self._after_end = False

    def feed(self, text: str) -> list[Content | Reasoning]:
        """Consume a chunk of output; return the deltas that are now certain."""
        self._buffer += text
        out: list[Content | Reasoning] = []
        while self._buffer:
            marker = self.end if self.thinking else self.start
            at = self._buffer.find(marker)
            if at >= 0:
                self._emit(self._buffer[:at], out)
                self._buffer = self._buffer[at + len(marker) :]
                self._after_end = self.thinking
                self.thinking = not self.thinking
                continue
            keep = held_prefix(self._buffer, marker)
            self._emit(self._buffer[: len(self._buffer) - keep], out)
            self._buffer = self._buffer[len(self._buffer) - keep :]
            break
        return out

    def finish(self) -> list[Content | Reasoning]:
        """Flush held text at the end of output (a partial marker is plain text)."""
        out: list[Content | Reasoning] = []
        self._emit(self._buffer, out)
        self._buffer = ""
        return out

    def _emit(self, text: str, out: list[Content | Reasoning]) -> None:
        if self._after_end and not self.thinking:
            text = text.lstrip()
            if not text:
                return
            self._after_end = False
        if text:
            out.append(Reasoning(text) if self.thinking else Content(text))


class ToolParser:
    """Finds tool-call markup in content and turns it into call deltas.

    Content outside the markup passes through as :class:`Content` (live);
    the markup is withheld and becomes :class:`CallBegin`, :class:`CallArguments`
    fragments and :class:`CallEnd`. Subclasses set ``start``/``end`` markers
    and implement :meth:`open_block`, which returns the object that parses one
    marked block. Markup that cannot be parsed falls back to plain content
    (reference, chat "Tool calls": repair first, then give up).

    Args:
        tools (Sequence[Mapping]): the request's OpenAI function tools (their
            ``parameters`` schemas decode argument values).
    """

    name: ClassVar[str] = ""
    #: Text that opens a call block; ``end`` closes it ("" = runs to the end of output).
    start: ClassVar[str] = "<tool_call>"
    end: ClassVar[str] = "</tool_call>"
    #: The block must open the output (after whitespace), e.g. Llama 3 JSON.
    only_at_start: ClassVar[bool] = False
    #: The start marker is part of the block's text (it is itself syntax).
    keep_start: ClassVar[bool] = False
    #: Leading tokens skipped before an ``only_at_start`` opening (``<|python_tag|>``).
    prefixes: ClassVar[tuple[str, ...]] = ()
    #: xgrammar's built-in structural tag for this format, if it has one.
    xgrammar_model: ClassVar[str | None] = None

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        self.tools = tuple(tools)
        self._buffer = ""
        self._block: Any = None
        self._block_text: list[str] = []
        self._seen_text = False
        self._held_space = ""
        self._calls = 0

    @property
    def holding(self) -> bool:
        """Text is held back as (possible) markup: an open block, or the
        start of a marker the next chunk may complete."""
        return self._block is not None or bool(self._buffer)

    def open_block(self) -> Any:
        """A fresh block parser with ``feed(text) -> deltas`` and
        ``close() -> deltas | None`` (``None``: not a call, show it as text)."""
        raise NotImplementedError

    def feed(self, text: str) -> list[ParserDelta]:
        """Consume a chunk of content; return the deltas that are now certain."""
        self._buffer += text
        out: list[ParserDelta] = []
        while self._buffer:
            if self._block is None:
                if not self._scan_content(out):
                    break
            elif not self._scan_block(out):
                break
        return out

    def finish(self, cut: bool = False) -> list[ParserDelta]:
        """Flush at the end of output: an open block is closed (repaired if needed).

        Args:
            cut (bool): the token budget ended the output (``finish_reason:
                "length"``). The open block is then neither repaired nor shown:
                calls that already ended inside it stand, a call still open gets
                no :class:`CallEnd` (the caller drops it), and the rest of the
                block, like a held partial start marker, is discarded as markup.
                Default: ``False``.
        """
        out: list[ParserDelta] = []
        if cut:
            self._block, self._buffer = None, ""
            return out
        if self._block is not None:
            self._block_text.append(self._buffer)
            out += self._block.feed(self._buffer)
            self._close_block(out)
        elif self._buffer:
            self._content(self._buffer, out)
        self._buffer = ""
        return out

    def _scan_content(self, out: list[ParserDelta]) -> bool:
        if self.only_at_start:
            return self._scan_start_only(out)
        buf = self._buffer
        at = buf.find(self.start)
        if at < 0:
            keep = held_prefix(buf, self.start)
            self._content(buf[: len(buf) - keep], out)
            self._buffer = buf[len(buf) - keep :]
            return False
        self._content(buf[:at], out)
        self._open(buf[at:] if self.keep_start else buf[at + len(self.start) :])
        return True

    def _scan_start_only(self, out: list[ParserDelta]) -> bool:
        """Formats without an opening sentinel (Llama 3 JSON, bare pythonic
        lists) count as calls only when the output opens with them."""
        buf = self._buffer
        if self._seen_text:
            self._content(buf, out)
            self._buffer = ""
            return False
        head = buf.lstrip()
        for prefix in self.prefixes:
            head = head[len(prefix) :].lstrip() if head.startswith(prefix) else head
        if head.startswith(self.start):
            self._open(head if self.keep_start else head[len(self.start) :])
            return True
        if self.start.startswith(head) or any(p.startswith(head) for p in self.prefixes):
            return False  # could still become the opening: hold
        self._seen_text = True
        return True

    def _open(self, rest: str) -> None:
        self._block = self.open_block()
        self._block_text = [] if self.keep_start else [self.start]
        self._buffer = rest

    def _scan_block(self, out: list[ParserDelta]) -> bool:
        buf = self._buffer
        at = buf.find(self.end) if self.end else -1
        if at < 0:
            keep = held_prefix(buf, self.end) if self.end else 0
            piece, self._buffer = buf[: len(buf) - keep], buf[len(buf) - keep :]
            self._block_text.append(piece)
            out += self._block.feed(piece)
            return False
        self._block_text.append(buf[: at + len(self.end)])
        out += self._block.feed(buf[:at])
        self._buffer = buf[at + len(self.end) :]
        self._close_block(out)
        return True

    def _close_block(self, out: list[ParserDelta]) -> None:
        deltas = self._block.close()
        if deltas is None:  # not a call after all: the markup is content
            self._content("".join(self._block_text), out, markup=True)
        else:
            out += deltas
            self._calls += 1
        self._block = None

    def _content(self, text: str, out: list[ParserDelta], markup: bool = False) -> None:
        """Emit content; whitespace between or after calls is held (and dropped
        at the end) so a reply of only calls has no content."""
        if not text:
            return
        if self._calls and not markup:
            if not text.strip():
                self._held_space += text
                return
            text, self._held_space = self._held_space + text, ""
        self._seen_text = self._seen_text or bool(text.strip())
        out.append(Content(text))

"""The file tools: ``read``, ``ls``, ``grep`` (read-only) and ``edit``, ``write``.

Each takes the workspace, the call's arguments (a JSON object) and the output
cap in bytes, and returns the text fed back to the model, or raises
:class:`~.workspace.ToolError`. They are synchronous (the socket runs them on
a worker thread); every path goes through :meth:`Workspace.path`.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mlxspec.handlers.webchat.tools.workspace import ToolError, Workspace

__all__ = ["edit", "grep", "ls", "read", "write"]

#: Entries ``ls`` lists and matches ``grep`` reports, at most.
MAX_ENTRIES = 500
#: Files larger than this are skipped by ``grep`` (bytes).
GREP_FILE_BYTES = 2 * 2**20


def _text(args: dict[str, Any], name: str, *, empty: bool = False) -> str:
    value = args.get(name)
    if not isinstance(value, str) or (not value and not empty):
        raise ToolError(f"{name} must be a {'' if empty else 'non-empty '}string")
    return value


def cap(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` UTF-8 bytes, with a note saying so."""
    raw = text.encode("utf-8", "replace")
    if len(raw) <= limit:
        return text
    return raw[:limit].decode("utf-8", "ignore") + f"\n[output cut at {limit} bytes]"


def _regular(path: Path) -> bool:
    """Whether ``path`` is a regular file itself (not a link, FIFO, socket or device:
    opening a FIFO blocks the worker thread until a writer comes)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def read(ws: Workspace, args: dict[str, Any], limit: int) -> str:
    """``read {path}``: a text file's content (cut at ``limit`` bytes).

    Raises:
        ToolError: not a regular file, or a binary one (a NUL byte in its first
            4 KiB, ``grep``'s rule): its bytes would fill the model's context.
    """
    path = ws.path(args.get("path"))
    if not _regular(path):
        raise ToolError(f"{args['path']!r} is not a file")
    with path.open("rb") as f:
        data = f.read(limit + 1)
    if b"\x00" in data[:4096]:
        raise ToolError(f"{args['path']!r} is a binary file")
    return cap(data.decode("utf-8", "replace"), limit)


def ls(ws: Workspace, args: dict[str, Any], limit: int) -> str:
    """``ls {path?}``: a folder's entries, sorted, folders with a trailing ``/``."""
    path = ws.path(args.get("path") or ".")
    if not path.is_dir():
        raise ToolError(f"{args.get('path')!r} is not a folder")
    names = sorted(os.scandir(path), key=lambda e: e.name)
    lines = [e.name + ("/" if e.is_dir(follow_symlinks=False) else "") for e in names]
    more = len(lines) - MAX_ENTRIES
    text = "\n".join(lines[:MAX_ENTRIES]) + (f"\n[{more} more entries]" if more > 0 else "")
    return cap(text or "(empty)", limit)


def _files(ws: Workspace, top: Path) -> Iterator[Path]:
    """Regular files under ``top``, never through a symlink (those may lead out),
    never a FIFO, socket or device (reading a FIFO blocks)."""
    if _regular(top):
        yield top
        return
    for folder, dirs, files in os.walk(top, followlinks=False):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".git"))
        for name in sorted(files):
            path = Path(folder, name)
            if _regular(path):
                yield path


def grep(ws: Workspace, args: dict[str, Any], limit: int) -> str:
    """``grep {pattern, path?}``: lines matching a Python regular expression,
    as ``file:line: text``, at most :data:`MAX_ENTRIES` of them."""
    try:
        pattern = re.compile(_text(args, "pattern"))
    except re.error as exc:
        raise ToolError(f"pattern is not a regular expression: {exc}") from exc
    top = ws.path(args.get("path") or ".")
    found: list[str] = []
    for path in _files(ws, top):
        if path.stat().st_size > GREP_FILE_BYTES:
            continue
        data = path.read_bytes()
        if b"\x00" in data[:4096]:
            continue  # binary
        for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
            if pattern.search(line):
                found.append(f"{ws.show(path)}:{number}: {line}")
                if len(found) >= MAX_ENTRIES:
                    return cap("\n".join(found) + "\n[match limit reached]", limit)
    return cap("\n".join(found) or "no match", limit)


def edit(ws: Workspace, args: dict[str, Any], limit: int) -> str:
    """``edit {path, oldText, newText}``: replace the one occurrence of ``oldText``.

    Raises:
        ToolError: ``oldText`` occurs zero or several times (say more of it).
    """
    path = ws.path(args.get("path"))
    old, new = _text(args, "oldText"), _text(args, "newText", empty=True)
    if not _regular(path):
        raise ToolError(f"{args['path']!r} is not a file")
    text = path.read_text(encoding="utf-8")
    count = text.count(old)
    if count != 1:
        raise ToolError(f"oldText occurs {count} times in {args['path']!r}: it must occur once")
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    return f"edited {ws.show(path)}"


def write(ws: Workspace, args: dict[str, Any], limit: int) -> str:
    """``write {path, content}``: create or replace a file (its folders made)."""
    path = ws.path(args.get("path"), exists=False)
    content = _text(args, "content", empty=True)
    if path.is_dir():
        raise ToolError(f"{args['path']!r} is a folder")
    if os.path.lexists(path) and not _regular(path):
        raise ToolError(f"{args['path']!r} is not a file")  # a FIFO's open would block
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content, encoding="utf-8")
    return f"wrote {len(content.encode())} bytes to {ws.show(path)}"

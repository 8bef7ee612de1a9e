"""The coding tools' confinement and file tools, without a server."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mlxspec.errors import ApiError
from mlxspec.handlers.webchat.queue import MAX_QUEUED, PromptQueue
from mlxspec.handlers.webchat.tools import files
from mlxspec.handlers.webchat.tools.app_context import AppContext
from mlxspec.handlers.webchat.tools.approvals import ApprovalList
from mlxspec.handlers.webchat.tools.workspace import ToolError, Workspace


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("one two two\n")
    (tmp_path / "outside.txt").write_text("secret")
    (root / "out").symlink_to(tmp_path)
    (root / "passwd").symlink_to("/etc/passwd")
    return Workspace(root)


@pytest.mark.parametrize(
    "given", ["../outside.txt", "out/outside.txt", "passwd", "/etc/passwd", "sub/../../outside.txt"]
)
def test_paths_that_resolve_outside_are_refused(ws: Workspace, given: str) -> None:
    with pytest.raises(ToolError, match="is outside the workspace"):
        ws.path(given)


@pytest.mark.parametrize("given", [None, "", 3, "a\x00b"])
def test_a_path_must_be_a_string(ws: Workspace, given: object) -> None:
    with pytest.raises(ToolError, match="path must be a non-empty string"):
        ws.path(given)


def test_the_workspace_itself_and_inside_paths_resolve(ws: Workspace) -> None:
    assert ws.path(".") == ws.root and ws.path(str(ws.root / "a.txt")) == ws.root / "a.txt"
    assert ws.path("sub/new.txt", exists=False) == ws.root / "sub" / "new.txt"
    with pytest.raises(ToolError, match="does not exist"):
        ws.path("nope.txt")


def test_edit_needs_exactly_one_occurrence(ws: Workspace) -> None:
    with pytest.raises(ToolError, match="oldText occurs 2 times"):
        files.edit(ws, {"path": "a.txt", "oldText": "two", "newText": "2"}, 1000)
    with pytest.raises(ToolError, match="oldText occurs 0 times"):
        files.edit(ws, {"path": "a.txt", "oldText": "three", "newText": "3"}, 1000)
    assert files.edit(ws, {"path": "a.txt", "oldText": "one", "newText": "1"}, 1000) == (
        "edited a.txt"
    )
    assert (ws.root / "a.txt").read_text() == "1 two two\n"


def test_write_read_ls_and_grep(ws: Workspace) -> None:
    assert files.write(ws, {"path": "deep/er/b.txt", "content": "héllo"}, 1000) == (
        "wrote 6 bytes to deep/er/b.txt"
    )
    assert files.read(ws, {"path": "deep/er/b.txt"}, 1000) == "héllo"
    assert files.read(ws, {"path": "a.txt"}, 4) == "one \n[output cut at 4 bytes]"
    assert files.ls(ws, {}, 1000) == "a.txt\ndeep/\nout\npasswd\nsub/"
    assert files.grep(ws, {"pattern": "h.llo|secret"}, 1000) == "deep/er/b.txt:1: héllo"
    with pytest.raises(ToolError, match="not a regular expression"):
        files.grep(ws, {"pattern": "("}, 1000)
    with pytest.raises(ToolError, match="is outside the workspace"):
        files.write(ws, {"path": "out/x.txt", "content": "x"}, 1000)


def test_a_fifo_is_never_opened(ws: Workspace) -> None:
    """A named pipe blocks its reader until a writer comes: ``grep`` (which runs
    without approval) skips it, and ``read``, ``edit`` and ``write`` refuse it, so no
    worker thread is left blocked (the whole thread pool was, one call at a time)."""
    import os

    os.mkfifo(ws.root / "pipe")
    assert files.grep(ws, {"pattern": "two"}, 4096) == "a.txt:1: one two two"
    assert files.grep(ws, {"pattern": "x", "path": "pipe"}, 4096) == "no match"
    for run, args in (
        (files.read, {"path": "pipe"}),
        (files.edit, {"path": "pipe", "oldText": "a", "newText": "b"}),
        (files.write, {"path": "pipe", "content": "x"}),
    ):
        with pytest.raises(ToolError, match="'pipe' is not a file"):
            run(ws, args, 4096)


def test_read_refuses_a_binary_file(ws: Workspace) -> None:
    """Its bytes (NULs) would fill the model's context for good: refused, as ``grep``
    skips them."""
    (ws.root / "blob.bin").write_bytes(b"\x00" * 70_000)
    with pytest.raises(ToolError, match="'blob.bin' is a binary file"):
        files.read(ws, {"path": "blob.bin"}, 65536)


def test_the_always_allow_file(tmp_path: Path) -> None:
    approvals = ApprovalList(tmp_path / "cfg" / "tool-approvals.json")
    assert approvals.tools() == []
    assert approvals.add("bash") == ["bash"] and approvals.add("edit") == ["bash", "edit"]
    assert (approvals.path.stat().st_mode & 0o777) == 0o600
    assert (approvals.path.parent.stat().st_mode & 0o777) == 0o700
    assert approvals.remove("bash") == ["edit"] and approvals.remove("bash") == ["edit"]
    approvals.path.write_text("not json")
    assert approvals.tools() == []  # unreadable: nothing is always allowed


def test_the_prompt_queue() -> None:
    queue = PromptQueue()
    queue.add("later", None)
    queue.add("now", "steering")
    assert queue.frame() == {"type": "queue_update", "steering": ["now"], "followUp": ["later"]}
    assert queue.pop_next() == "now" and queue.pop_next() == "later" and not queue
    for i in range(MAX_QUEUED):
        queue.add(str(i), "followUp")
    with pytest.raises(ApiError, match="16 messages are queued already"):
        queue.add("one more", "steering")


def test_the_app_context_keeps_120_elements_and_says_where_the_user_is() -> None:
    asyncio.run(_app_context())


async def _app_context() -> None:
    sent: list[dict] = []

    async def send(frame: dict) -> None:
        sent.append(frame)

    app = AppContext(send)
    assert app.ambient() is None
    assert await app.run("get_current_app_context", {}) == (
        False,
        "the page has sent no context yet",
    )
    app.update({"route": "status", "snapshot": {"elements": [{"ref": str(i)} for i in range(300)]}})
    assert len(app.context["snapshot"]["elements"]) == 120
    assert app.ambient() == "[user is on: Status]"
    assert await app.run("spotlight_ui", {"label": "Send", "route": "lab"}) == (
        False,
        "unknown route 'lab': one of chat, status",
    )
    assert sent == []


@pytest.mark.parametrize(("context", "kept"), [(4096, 4096), (200_000, 64 * 1024), (100, 1024)])
def test_a_tool_result_is_cut_to_the_models_context(
    tmp_path: Path, context: int, kept: int
) -> None:
    """A call keeps at most ``--web-tool-output``'s 64 KiB and at most the context
    window in bytes: a longer result left every later prompt of the chat over the
    window (67k tokens on a 4k model)."""
    from types import SimpleNamespace

    from mlxspec.config import ServeConfig
    from mlxspec.handlers.webchat.hub import ChatHub

    (tmp_path / "ws").mkdir()
    engine = SimpleNamespace(chat_format=None)
    config = ServeConfig(web_tools=str(tmp_path / "ws"))
    hub = ChatHub(engine, store=None, context_window=context, config=config)  # type: ignore[arg-type]
    runner = hub.tool_runner()
    assert runner is not None and runner.limit == kept

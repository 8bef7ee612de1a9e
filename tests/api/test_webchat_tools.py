"""The web chat's coding tools over ``/ws/chat``: approval cards, the tool loop, the caps.

A scripted model (:class:`tests.fakes.FakeEngine` on the Hermes tool fixture's
template) answers each model step with the next reply the test queued: a
``<tool_call>`` or plain text. Everything runs in-process; tests whose calls run
``bash`` start a process and are marked ``subprocess``. The queue tests at the end
make the model stream slowly (``FakeEngine.delay``), so a turn is still running
when the next prompt comes.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from fixtures.tool_models import build_tool_model
from mlxspec.config import ServeConfig
from mlxspec.http.app import create_app
from tests.conftest import LiveServer
from tests.fakes import FakeEngine
from tests.webchat_client import ChatClient, wait_for


def call(name: str, **args: Any) -> str:
    """A Hermes tool call as the model writes it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': args})}\n</tool_call>"


class Scripted:
    """The fake engine and the replies its model steps give, in order."""

    def __init__(self, folder: Path) -> None:
        self.engine = FakeEngine.from_dir(folder, "agent")
        self.replies: list[str] = []
        self.engine.script = lambda request: [self.replies.pop(0) if self.replies else "done"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tool_model(tmp_path_factory.mktemp("agent") / "hermes", "hermes")


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """One workspace and config folder for the module (reset before each test),
    so the tests that share :func:`agent`'s server see the folders it serves."""
    root = tmp_path_factory.mktemp("tools")
    (root / "secret.txt").write_text("outside")
    folders = {"ws": root / "ws", "config": root / "config"}
    folders["ws"].mkdir()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("MLXSPEC_CONFIG_DIR", str(folders["config"]))
        yield folders


@pytest.fixture
def workspace(shared: dict[str, Path]) -> Path:
    root = shared["ws"]
    for entry in root.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    (root / "notes.txt").write_text("alpha\nbeta\n")
    return root


@pytest.fixture
def config_dir(shared: dict[str, Path]) -> Path:
    (shared["config"] / "tool-approvals.json").unlink(missing_ok=True)
    return shared["config"]


def serve(model_dir: Path, tmp_path: Path, workspace: Path | None, **config: Any) -> Any:
    scripted = Scripted(model_dir)
    settings = ServeConfig(
        chat_db=str(tmp_path / "chat.sqlite3"),
        web_tools=str(workspace) if workspace else None,
        **config,
    )
    server = LiveServer(create_app(scripted.engine, settings))
    return scripted, server


@pytest.fixture(scope="module")
def agent_server(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory, shared: dict[str, Path]
) -> Iterator[tuple[Scripted, LiveServer]]:
    db = tmp_path_factory.mktemp("agentdb")
    scripted, server = serve(model_dir, db, shared["ws"], web_tool_timeout=20.0)
    with server:
        yield scripted, server


@pytest.fixture
def agent(
    agent_server: tuple[Scripted, LiveServer], workspace: Path, config_dir: Path
) -> tuple[Scripted, LiveServer]:
    """The module's server with a fresh script, workspace and always-allow list."""
    scripted, _ = agent_server
    scripted.replies.clear()
    engine = scripted.engine
    engine.script = lambda request: [scripted.replies.pop(0) if scripted.replies else "done"]
    engine.delay = 0.0
    engine.requests.clear()
    engine.chats.clear()
    engine.prompts.clear()
    return agent_server


def tools_on(chat: ChatClient) -> None:
    chat.send({"type": "set_coding_tools", "enabled": True})
    frame = chat.until("coding_tools")[-1]
    assert frame == {"type": "coding_tools", "active": True, "pending": None}


def kinds(frames: list[dict[str, Any]]) -> list[str]:
    return [f["type"] for f in frames]


def test_coding_tools_are_off_without_web_tools(model_dir: Path, tmp_path: Path) -> None:
    scripted, server = serve(model_dir, tmp_path, None)
    with server, ChatClient(server.base) as chat:
        assert chat.greeting["ready"]["codingTools"] is False
        chat.send({"type": "set_coding_tools", "enabled": True})
        error = chat.until("error")[-1]
        assert error["param"] == "enabled" and "--web-tools WORKSPACE_DIR" in error["message"]
        scripted.replies = [call("ls")]
        turn = chat.turn({"type": "prompt", "text": "look"})
        # no tool is offered, so the call is text, as on the API without tools
        assert "tool_start" not in kinds(turn["frames"]) and turn["text"] == call("ls")
        assert len(scripted.engine.requests) == 1  # no second step
        assert "# Tools" not in scripted.engine.prompts[-1]


@pytest.mark.subprocess
def test_an_allowed_bash_call_streams_and_its_result_reaches_the_model(
    agent: tuple[Scripted, LiveServer], workspace: Path
) -> None:
    scripted, server = agent
    with ChatClient(server.base) as chat:
        assert chat.greeting["ready"]["codingTools"] is True
        tools_on(chat)
        scripted.replies = [
            call("bash", command="for i in 1 2 3; do echo line$i; sleep 0.3; done; pwd"),
            "all done",
        ]
        chat.send({"type": "prompt", "text": "count"})
        ask = chat.until("tool_approval_request")[-1]
        assert ask["tool"] == "bash" and ask["args"]["command"].startswith("for i")
        chat.send({"type": "approval", "callId": ask["callId"], "decision": "allow"})
        frames = chat.until("turn_end") + chat.until("context")
        updates = [f["chunk"] for f in frames if f["type"] == "tool_update"]
        assert len(updates) >= 2  # progressive: the sleeps split the output
        end_at = kinds(frames).index("tool_end")
        assert kinds(frames).index("tool_update") < end_at
        end = frames[end_at]
        assert end["ok"] is True and end["result"] == f"line1\nline2\nline3\n{workspace}\n"
        assert "".join(updates) == end["result"]
        text = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
        assert text == "all done" and frames[-2]["finishReason"] == "stop"
        assert kinds(frames).count("turn_start") == 0  # one turn: started before the call
        second = scripted.engine.chats[-1]  # the second step's prompt holds the result
        assert second[-1]["role"] == "tool" and second[-1]["content"] == end["result"]
        chat.send({"type": "list_sessions"})
        sid = chat.until("sessions")[-1]["activePath"]
        chat.send({"type": "open_session", "path": sid})
        items = chat.until("history")[-1]["items"]
        assert [i["role"] for i in items] == ["user", "assistant", "tool", "assistant"]
        assert items[2]["meta"] == {"toolCallId": ask["callId"], "tool": "bash", "ok": True}


def test_deny_and_edit(agent: tuple[Scripted, LiveServer], workspace: Path) -> None:
    scripted, server = agent
    with ChatClient(server.base) as chat:
        tools_on(chat)
        scripted.replies = [call("write", path="a.txt", content="model"), "ok"]
        chat.send({"type": "prompt", "text": "write"})
        ask = chat.until("tool_approval_request")[-1]
        chat.send({"type": "approval", "callId": ask["callId"], "decision": "deny"})
        end = chat.until("tool_end")[-1]
        assert end["ok"] is False and end["result"].startswith("denied")
        chat.until("context")
        assert not (workspace / "a.txt").exists()
        assert scripted.engine.chats[-1][-1]["content"] == end["result"]

        scripted.replies = [call("write", path="a.txt", content="model"), "ok"]
        chat.send({"type": "prompt", "text": "write again"})
        ask = chat.until("tool_approval_request")[-1]
        edited = {"path": "sub/a.txt", "content": "mine"}
        chat.send(
            {"type": "approval", "callId": ask["callId"], "decision": "edit", "editedArgs": edited}
        )
        end = chat.until("tool_end")[-1]
        assert end == {
            "type": "tool_end",
            "callId": ask["callId"],
            "ok": True,
            "result": '[run with arguments edited by the user: {"path": "sub/a.txt", '
            '"content": "mine"}]\nwrote 4 bytes to sub/a.txt',
        }
        chat.until("context")
        # the model is told what ran, not that its own call did
        assert scripted.engine.chats[-1][-1]["content"] == end["result"]
        assert (workspace / "sub" / "a.txt").read_text() == "mine"
        assert not (workspace / "a.txt").exists()


def test_edit_without_edited_args_and_an_unknown_call_are_error_frames(
    agent: tuple[Scripted, LiveServer],
) -> None:
    _, server = agent
    with ChatClient(server.base) as chat:
        chat.send({"type": "approval", "callId": "call-x", "decision": "allow"})
        error = chat.until("error")[-1]
        assert error["message"] == "no tool call 'call-x' awaits approval"
        assert error["param"] == "callId"
        chat.send({"type": "approval", "callId": "call-x", "decision": "edit"})
        assert chat.until("error")[-1]["message"] == "editedArgs is required"
        chat.send({"type": "approval", "callId": "call-x", "decision": "maybe"})
        assert chat.until("error")[-1]["param"] == "decision"
        chat.send("{not json")
        assert chat.until("error")[-1]["message"].startswith("invalid JSON frame")
        megabyte = "x" * 2**20
        chat.send(megabyte)  # a 1 MB frame that is not JSON
        assert chat.until("error")[-1]["message"].startswith("invalid JSON frame")
        chat.send({"type": "approval", "callId": megabyte, "decision": "allow"})
        error = chat.until("error")[-1]
        assert error["param"] == "callId" and len(error["message"]) < 300  # not echoed back
        chat.send({"type": "list_sessions"})
        assert chat.until("sessions")[-1]["type"] == "sessions"  # the socket stays open


def test_reads_are_confined_to_the_workspace(
    agent: tuple[Scripted, LiveServer], workspace: Path
) -> None:
    scripted, server = agent
    (workspace / "etc").symlink_to("/etc")
    (workspace / "inner").symlink_to(workspace / "notes.txt")
    with ChatClient(server.base) as chat:
        tools_on(chat)
        scripted.replies = [
            call("read", path="../secret.txt"),
            call("read", path="etc/passwd"),
            call("ls", path="etc"),
            call("grep", pattern="root", path="/etc"),
            call("read", path="inner"),
            call("grep", pattern="bet"),
            "done",
        ]
        turn = chat.turn({"type": "prompt", "text": "snoop"})
        ends = [f for f in turn["frames"] if f["type"] == "tool_end"]
        assert [e["ok"] for e in ends] == [False, False, False, False, True, True]
        assert ends[0]["result"] == "'../secret.txt' is outside the workspace"
        assert ends[1]["result"] == "'etc/passwd' is outside the workspace"
        assert ends[2]["result"] == "'etc' is outside the workspace"
        assert ends[3]["result"] == "'/etc' is outside the workspace"
        assert ends[4]["result"] == "alpha\nbeta\n"
        assert ends[5]["result"] == "notes.txt:2: beta"  # the symlinks are not followed
        assert not any(f["type"] == "tool_approval_request" for f in turn["frames"])


def test_the_step_limit_ends_the_loop(
    model_dir: Path, tmp_path: Path, workspace: Path, config_dir: Path
) -> None:
    scripted, server = serve(model_dir, tmp_path, workspace, web_tool_steps=3)
    scripted.engine.script = lambda request: [call("ls")]  # asks forever
    with server, ChatClient(server.base) as chat:
        tools_on(chat)
        turn = chat.turn({"type": "prompt", "text": "loop"})
        ends = [f for f in turn["frames"] if f["type"] == "tool_end"]
        assert [e["ok"] for e in ends] == [True, True, False]
        assert ends[-1]["result"] == "not run: the turn reached its step limit (3 model steps)"
        assert len(scripted.engine.requests) == 3
        assert turn["end"]["finishReason"] == "tool_calls"


@pytest.mark.subprocess
def test_always_allow_is_kept_across_a_restart_and_forgotten_through_settings(
    model_dir: Path, tmp_path: Path, workspace: Path, config_dir: Path
) -> None:
    scripted, server = serve(model_dir, tmp_path, workspace)
    with server, ChatClient(server.base) as chat:
        tools_on(chat)
        scripted.replies = [call("bash", command="echo one"), "ok"]
        chat.send({"type": "prompt", "text": "run"})
        ask = chat.until("tool_approval_request")[-1]
        chat.send(
            {"type": "approval", "callId": ask["callId"], "decision": "allow", "alwaysAllow": True}
        )
        assert chat.until("tool_approvals")[-1]["alwaysAllow"] == ["bash"]
        assert chat.until("tool_end")[-1]["result"] == "one\n"
        chat.until("context")
    saved = config_dir / "tool-approvals.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    scripted, server = serve(model_dir, tmp_path, workspace)  # a restart
    with server, ChatClient(server.base) as chat:
        assert httpx.get(f"{server.base}/api/settings/tool-approvals").json() == {
            "ok": True,
            "alwaysAllow": ["bash"],
        }
        tools_on(chat)
        scripted.replies = [call("bash", command="echo two"), "ok"]
        turn = chat.turn({"type": "prompt", "text": "run"})
        assert "tool_approval_request" not in kinds(turn["frames"])
        assert [f["result"] for f in turn["frames"] if f["type"] == "tool_end"] == ["two\n"]
        missing = httpx.request("DELETE", f"{server.base}/api/settings/tool-approvals", json={})
        assert missing.status_code == 400 and missing.json()["error"]["message"] == "tool required"
        gone = httpx.request(
            "DELETE", f"{server.base}/api/settings/tool-approvals", json={"tool": "bash"}
        )
        assert gone.json() == {"ok": True, "alwaysAllow": []}
        again = httpx.request(
            "DELETE", f"{server.base}/api/settings/tool-approvals", json={"tool": "bash"}
        )
        assert again.status_code == 200 and again.json()["alwaysAllow"] == []
        scripted.replies = [call("bash", command="echo three"), "ok"]
        chat.send({"type": "prompt", "text": "run"})
        assert chat.until("tool_approval_request")[-1]["tool"] == "bash"  # asks again
        chat.send({"type": "abort"})
        assert chat.until("turn_end")[-1]["finishReason"] == "aborted"


@pytest.mark.subprocess
def test_abort_kills_the_commands_process_group(agent: tuple[Scripted, LiveServer]) -> None:
    scripted, server = agent
    with ChatClient(server.base) as chat:
        tools_on(chat)
        scripted.replies = [call("bash", command="echo $$; sleep 60 & sleep 60; echo never")]
        chat.send({"type": "prompt", "text": "wait"})
        ask = chat.until("tool_approval_request")[-1]
        chat.send({"type": "approval", "callId": ask["callId"], "decision": "allow"})
        pgid = int(chat.until("tool_update")[-1]["chunk"].split()[0])
        os.killpg(pgid, 0)  # running
        chat.send({"type": "abort"})
        frames = chat.until("turn_end")
        end = next(f for f in frames if f["type"] == "tool_end")
        assert end["ok"] is False and end["result"].endswith("[killed: aborted]")
        assert frames[-1]["finishReason"] == "aborted"

        def gone() -> bool:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return True
            return False

        wait_for(gone, 5)  # the background sleep too: the whole group
        assert len(scripted.engine.requests) == 1  # no step after the abort


@pytest.mark.subprocess
def test_time_and_output_caps_kill_the_group(
    model_dir: Path, tmp_path: Path, workspace: Path, config_dir: Path
) -> None:
    scripted, server = serve(
        model_dir, tmp_path, workspace, web_tool_timeout=1.0, web_tool_output=1000
    )
    with server, ChatClient(server.base) as chat:
        tools_on(chat)
        chat.send({"type": "set_coding_tools", "enabled": True})
        scripted.replies = [
            call("bash", command="sleep 30"),
            call("bash", command="yes"),
            call("bash", command="exit 3"),
            "done",
        ]
        chat.send({"type": "prompt", "text": "caps"})
        results = []
        for _ in range(3):
            ask = chat.until("tool_approval_request")[-1]
            chat.send({"type": "approval", "callId": ask["callId"], "decision": "allow"})
            results.append(chat.until("tool_end")[-1])
        assert results[0]["result"] == "[killed: timed out after 1 s]"
        assert results[1]["result"].endswith("[killed: output passed 1000 bytes]")
        assert len(results[1]["result"]) == 1000 + len("\n[killed: output passed 1000 bytes]")
        assert results[2]["result"] == "[exit code 3]"
        assert not any(r["ok"] for r in results)
        assert chat.until("turn_end")[-1]["finishReason"] == "stop"


def test_set_coding_tools_during_a_turn_is_pending_until_it_ends(
    agent: tuple[Scripted, LiveServer],
) -> None:
    scripted, server = agent
    with ChatClient(server.base) as chat:
        tools_on(chat)
        scripted.replies = [call("write", path="x", content="y"), "ok"]
        chat.send({"type": "prompt", "text": "w"})
        ask = chat.until("tool_approval_request")[-1]
        chat.send({"type": "set_coding_tools", "enabled": False})
        assert chat.until("coding_tools")[-1] == {
            "type": "coding_tools",
            "active": True,
            "pending": False,
        }
        chat.send({"type": "approval", "callId": ask["callId"], "decision": "deny"})
        frames = chat.until("coding_tools")
        assert "turn_end" in kinds(frames)
        assert frames[-1] == {"type": "coding_tools", "active": False, "pending": None}
        assert kinds(frames).index("turn_end") < kinds(frames).index("context")
        chat.send({"type": "list_sessions"})
        sid = chat.until("sessions")[-1]["activePath"]
    with ChatClient(server.base) as other:
        other.send({"type": "open_session", "path": sid})
        assert other.until("history")[-1]["settings"]["codingTools"] is False


def test_a_follow_up_waits_for_the_turn_and_then_runs(model_dir: Path, tmp_path: Path) -> None:
    scripted, server = serve(model_dir, tmp_path, None)
    scripted.engine.delay = 0.05
    scripted.engine.script = lambda request: ["slow "] * 20
    with server, ChatClient(server.base) as chat:
        chat.send({"type": "prompt", "text": "first"})
        chat.until("text_delta")
        chat.send({"type": "prompt", "text": "second"})
        chat.send({"type": "prompt", "text": "third", "queue": "followUp"})
        assert chat.until("queue_update")[-1] == {
            "type": "queue_update",
            "steering": [],
            "followUp": ["second"],
        }
        assert chat.until("queue_update")[-1]["followUp"] == ["second", "third"]
        frames = chat.until("turn_start")  # the first turn ends, the second starts
        assert kinds(frames).index("turn_end") < kinds(frames).index("turn_start")
        assert frames[-2] == {"type": "queue_update", "steering": [], "followUp": ["third"]} or (
            any(
                f == {"type": "queue_update", "steering": [], "followUp": ["third"]} for f in frames
            )
        )
        chat.send({"type": "abort"})  # stops the second turn and drops "third"
        frames = chat.until("turn_end")
        assert {"type": "queue_update", "steering": [], "followUp": []} in frames
        chat.until("context")
        chat.send({"type": "list_sessions"})
        sid = chat.until("sessions")[-1]["activePath"]
        chat.send({"type": "open_session", "path": sid})
        items = chat.until("history")[-1]["items"]
        assert [(i["role"], i["content"][:6]) for i in items] == [
            ("user", "first"),
            ("assistant", "slow s"),
            ("user", "second"),
            ("assistant", items[3]["content"][:6]),
        ]
        assert items[3]["meta"]["finishReason"] == "aborted"
        assert len(scripted.engine.requests) == 2  # "third" never ran


def test_steering_joins_the_running_turn_before_its_next_step(
    model_dir: Path, tmp_path: Path, workspace: Path, config_dir: Path
) -> None:
    scripted, server = serve(model_dir, tmp_path, workspace)
    scripted.engine.delay = 0.05
    steps = [["thinking "] * 10 + [call("ls")], ["ok"]]
    scripted.engine.script = lambda request: steps.pop(0) if steps else ["more"]
    with server, ChatClient(server.base) as chat:
        tools_on(chat)
        chat.send({"type": "prompt", "text": "look around"})
        chat.until("text_delta")
        chat.send({"type": "prompt", "text": "only .txt files", "queue": "steering"})
        assert chat.until("queue_update")[-1]["steering"] == ["only .txt files"]
        frames = chat.until("turn_end")
        assert {"type": "queue_update", "steering": [], "followUp": []} in frames
        assert kinds(frames).count("turn_start") == 0  # the same turn took it
        second = scripted.engine.chats[-1]  # the second step's prompt
        assert [m["role"] for m in second[-3:]] == ["assistant", "tool", "user"]
        assert second[-1]["content"] == "only .txt files"
        assert len(scripted.engine.requests) == 2


@pytest.mark.subprocess
def test_an_mcp_stdio_servers_tool_answers_a_call_after_approval(
    model_dir: Path, tmp_path: Path, config_dir: Path
) -> None:
    server_script = Path(__file__).resolve().parents[2] / "fixtures" / "mcp_add_server.py"
    config = tmp_path / "mcp.json"
    spec = {"command": sys.executable, "args": [str(server_script)]}
    config.write_text(json.dumps({"mcpServers": {"calc": spec, "web": {"url": "http://x"}}}))
    scripted, server = serve(model_dir, tmp_path, None, mcp_config=str(config))
    with server, ChatClient(server.base) as chat:
        assert chat.greeting["ready"]["codingTools"] is True  # MCP tools alone
        tools_on(chat)
        scripted.replies = [call("mcp__calc__add", a=2, b=40), "the sum is 42"]
        chat.send({"type": "prompt", "text": "add them"})
        ask = chat.until("tool_approval_request", timeout=120)[-1]
        assert ask["tool"] == "mcp__calc__add" and ask["args"] == {"a": 2, "b": 40}
        offered = scripted.engine.prompts[-1]
        assert "mcp__calc__shout" in offered and '"name": "bash"' not in offered
        chat.send({"type": "approval", "callId": ask["callId"], "decision": "allow"})
        end = chat.until("tool_end", timeout=120)[-1]
        assert end["ok"] is True and end["result"] == "42"
        frames = chat.until("turn_end")
        text = "".join(f["delta"] for f in frames if f["type"] == "text_delta")
        assert text == "the sum is 42"
        assert scripted.engine.chats[-1][-1]["content"] == "42"


def test_the_app_aware_tools_read_navigate_and_spotlight(
    agent: tuple[Scripted, LiveServer],
) -> None:
    scripted, server = agent
    context = {
        "route": "chat",
        "step": {"index": 1, "count": 4, "label": "Configure"},
        "snapshot": {
            "route": "chat",
            "elements": [{"ref": f"e{i}", "label": f"button {i}"} for i in range(3)],
        },
    }
    with ChatClient(server.base) as chat:
        tools_on(chat)
        scripted.replies = ["no context yet"]
        chat.turn({"type": "prompt", "text": "hi"})
        assert "get_current_app_context" not in scripted.engine.prompts[-1]
        chat.send({"type": "context", "context": context})
        scripted.replies = [
            call("get_current_app_context"),
            call("navigate_app", route="quantize"),
            call("navigate_app", page="status"),
            call("spotlight_ui", target="prompt", message="Type here"),
            call("spotlight_ui", message="nothing named"),
            "done",
        ]
        turn = chat.turn({"type": "prompt", "text": "show me around"})
        steps = [c for c in scripted.engine.chats if c[0]["role"] == "system"]
        assert len(steps) == 6  # every model step of the turn starts with the ambient line
        assert all(c[0]["content"] == "[user is on: Chat · step 2/4]" for c in steps)
        ends = [f for f in turn["frames"] if f["type"] == "tool_end"]
        assert [e["ok"] for e in ends] == [True, False, True, True, False]
        seen = json.loads(ends[0]["result"])
        assert seen == context
        assert ends[1]["result"] == "unknown route 'quantize': one of chat, status"
        ui = [f for f in turn["frames"] if f["type"].startswith("ui_")]
        assert ui == [
            {"type": "ui_navigate", "route": "status"},
            {"type": "ui_spotlight", "target": "prompt", "message": "Type here"},
        ]
        assert ends[4]["result"] == "name the element: ref, label, selector or target"
        assert "tool_approval_request" not in kinds(turn["frames"])  # never gated

"""One web chat turn as an agent: model steps, with coding tool calls run between them.

:class:`AgentTurn` runs a :class:`~.turn.SocketTurn` per model step. When the
coding tools are on (``--web-tools`` and the session's ``set_coding_tools``) and
a step ends with calls to them, each call is run in order, and its result goes
back to the model as a ``tool`` message for the next step of the same turn, up
to ``--web-tool-steps`` model steps (reference, "Web chat WebSocket"):

- a gated tool (``bash``, ``edit``, ``write``) not always allowed sends
  ``tool_approval_request`` and waits for the user's ``approval``: ``allow``
  runs the call, ``edit`` runs it with ``editedArgs``, ``deny`` answers the
  model that the user refused; ``alwaysAllow`` adds the tool to the durable list
  (``tool_approvals`` tells the page);
- a running call streams ``tool_update`` chunks and ends with ``tool_end``;
- ``abort`` stops the model step, a pending approval, or a running command
  (its process group is killed); calls not yet run are answered as not run.

Every message is stored as it is made (the user's once the engine took the
first step, each answer and each tool result after it), so an aborted or
failed turn keeps what it did.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from mlxspec.handlers.webchat.sessions import ChatMessage, SessionSettings
from mlxspec.handlers.webchat.tools.approvals import ApprovalList
from mlxspec.handlers.webchat.tools.catalog import ToolRunner, gated
from mlxspec.handlers.webchat.turn import SendFrame, SocketTurn, call_args, chat_body

__all__ = ["AgentTurn"]

#: The result of a call that the step limit left unrun.
STEP_LIMIT = "not run: the turn reached its step limit ({} model steps)"
ABORTED = "not run: the turn was aborted"
DENIED = "denied: the user did not allow this call"


class AgentTurn:
    """One user turn: as many model steps as its tool calls need, up to a limit.

    Args:
        engine (Engine): the serving engine.
        session_id (str): the session.
        settings (SessionSettings): the session's settings.
        messages (Sequence[ChatMessage]): the conversation, ending with the
            user message to answer.
        overrides (dict): sampling for this turn only (``next_turn``).
        send (SendFrame): sends a frame to the socket.
        opened (Callable): awaited once the engine took the first step (the
            user's message is stored then).
        store (Callable): ``store(message, keep)`` appends a message after the
            first ``keep`` ones of the session.
        runner (ToolRunner | None): runs coding tool calls; ``None``: the tools
            are off for this turn.
        approvals (ApprovalList): the always-allow list.
        max_steps (int): model steps the turn may take.
        steer (Callable | None): returns the steering prompts sent since the
            last step (``prompt`` with ``queue: steering``); they join the
            conversation before the next model step. Default: ``None``.
    """

    def __init__(
        self,
        engine: Any,
        session_id: str,
        settings: SessionSettings,
        messages: Sequence[ChatMessage],
        overrides: dict[str, Any],
        send: SendFrame,
        opened: Callable[[], Awaitable[None]],
        store: Callable[[ChatMessage, int], Awaitable[Any]],
        runner: ToolRunner | None,
        approvals: ApprovalList,
        max_steps: int,
        steer: Callable[[], Awaitable[list[str]]] | None = None,
    ) -> None:
        self.engine, self.session_id, self.settings = engine, session_id, settings
        self.messages, self.overrides, self.send = list(messages), overrides, send
        self.opened, self.store, self.runner = opened, store, runner
        self.approvals, self.max_steps, self.steer = approvals, max_steps, steer
        self.step: SocketTurn | None = None
        self.pending: dict[str, asyncio.Future[dict[str, Any] | None]] = {}
        #: The arguments the user edited the current call to (``None``: as called).
        self.edited: Any = None
        self.aborted = False
        #: Whether the engine took the first step (the session holds the turn).
        self.stored = False
        #: What ``context`` reports after the turn (the last step's tokens).
        self.context_tokens: int | None = None

    def runs(self, name: str) -> bool:
        """Whether a call to tool ``name`` is run by this turn."""
        return self.runner is not None and self.runner.offers(name)

    def abort(self) -> None:
        """Stop the turn: the model step, a pending approval, a running command."""
        self.aborted = True
        if self.step is not None:
            self.step.abort()
        if self.runner is not None:
            self.runner.kill()
        for future in self.pending.values():
            if not future.done():
                future.set_result(None)

    def approve(self, frame: dict[str, Any]) -> bool:
        """Deliver an ``approval`` frame; ``False`` when no call awaits ``callId``."""
        future = self.pending.get(frame["callId"])
        if future is None or future.done():
            return False
        future.set_result(frame)
        return True

    async def run(self) -> dict[str, Any]:
        """Run the turn to its end; returns the ``turn_end`` frame to send."""
        tools = await self.runner.offered() if self.runner is not None else []
        app = self.runner.app if self.runner is not None else None
        end: dict[str, Any] = {"type": "turn_end", "finishReason": "error"}
        for index in range(self.max_steps):
            first = index == 0
            if not first and self.steer is not None:
                for text in await self.steer():  # the user's steering, before this step
                    await self._keep(ChatMessage("user", text))
            body = chat_body(
                self.session_id,
                self.settings,
                self.messages,
                self.overrides if first else None,
                tools,
                app.ambient() if app is not None else None,  # the page may have moved
            )
            self.step = SocketTurn(
                self.engine,
                body,
                self.session_id,
                self.send,
                self._opened if first else None,
                announce=first,
                runs=self.runs,
            )
            answer, end = await self.step.run()
            self.context_tokens = self.step.context_tokens
            if answer is None:  # refused: an error frame said why
                return end
            await self._keep(answer)
            calls = [c for c in answer.tool_calls if self.runs(c["function"]["name"])]
            if not calls:
                return end
            if self.aborted:  # the step said so already (tool_end "not run"): store it only
                for call in calls:
                    meta = {"toolCallId": call["id"], "tool": call["function"]["name"], "ok": False}
                    await self._keep(ChatMessage("tool", ABORTED, meta=meta))
                return end
            if index + 1 == self.max_steps:
                await self._answer_unrun(calls, STEP_LIMIT.format(self.max_steps))
                return end
            for call in calls:
                self.edited = None
                ok, result = await self._call(call)
                meta = {"toolCallId": call["id"], "tool": call["function"]["name"], "ok": ok}
                if self.edited is not None:  # what ran, for the model, the card and the store
                    meta["editedArgs"] = self.edited
                    note = json.dumps(self.edited, ensure_ascii=False)
                    result = f"[run with arguments edited by the user: {note}]\n{result}"
                await self.send(
                    {"type": "tool_end", "callId": call["id"], "ok": ok, "result": result}
                )
                await self._keep(ChatMessage("tool", result, meta=meta))
            if self.aborted:
                return {"type": "turn_end", "finishReason": "aborted"}
        return end

    async def _opened(self) -> None:
        await self.opened()
        self.stored = True

    async def _keep(self, message: ChatMessage) -> None:
        await self.store(message, len(self.messages))
        self.messages.append(message)

    async def _answer_unrun(self, calls: list[dict[str, Any]], why: str) -> None:
        for call in calls:
            await self.send({"type": "tool_end", "callId": call["id"], "ok": False, "result": why})
            meta = {"toolCallId": call["id"], "tool": call["function"]["name"], "ok": False}
            await self._keep(ChatMessage("tool", why, meta=meta))

    async def _call(self, call: dict[str, Any]) -> tuple[bool, str]:
        """Ask for approval where needed, then run one call."""
        assert self.runner is not None
        call_id, name = call["id"], call["function"]["name"]
        args = call_args(call["function"]["arguments"])
        if self.aborted:
            return False, ABORTED
        if gated(name) and name not in await asyncio.to_thread(self.approvals.tools):
            decision = await self._ask(call_id, name, args)
            if decision is None:
                return False, ABORTED
            if decision["decision"] == "deny":
                return False, DENIED
            if decision["decision"] == "edit":
                args = self.edited = decision["editedArgs"]
            if decision.get("alwaysAllow"):
                names = await asyncio.to_thread(self.approvals.add, name)
                await self.send({"type": "tool_approvals", "alwaysAllow": names})

        async def emit(chunk: str) -> None:
            await self.send({"type": "tool_update", "callId": call_id, "chunk": chunk})

        return await self.runner.run(name, args, emit)

    async def _ask(self, call_id: str, name: str, args: Any) -> dict[str, Any] | None:
        """Send ``tool_approval_request`` and wait for the user (``None``: aborted)."""
        future: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        self.pending[call_id] = future
        try:
            await self.send(
                {"type": "tool_approval_request", "callId": call_id, "tool": name, "args": args}
            )
            return await future
        finally:
            self.pending.pop(call_id, None)

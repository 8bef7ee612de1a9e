"""System turns after the first message, for chat templates that refuse them.

Anthropic's ``mid-conversation-system`` beta (Claude Code sends it) and OpenAI's
chat both allow a ``system`` message anywhere; many open-model templates
(Gemma's, Mistral's, Qwen3's) raise unless it comes first. :func:`render_chat`
(:mod:`.prompt`) retries such a template with :func:`inline_system_turns`.
"""

from __future__ import annotations


def inline_system_turns(messages: list[dict]) -> list[dict]:
    """``messages`` with every system turn after the first message moved into the
    nearest user turn, wrapped in ``<system>`` tags, for chat templates that
    refuse a system turn anywhere but first (Gemma's, Mistral's, Qwen3's).

    The nearest user turn is the one just before (when no assistant turn stands
    between them), else the next one; a system turn with neither becomes a user
    turn of its own. Order relative to assistant turns is kept.

    Args:
        messages (list[dict]): normalized chat messages (text ``content``).

    Returns:
        list[dict]: a new list; ``messages`` is not mutated.
    """
    out: list[dict] = []
    pending: list[str] = []  # system text waiting for the next user turn
    for i, message in enumerate(messages):
        if message.get("role") != "system" or i == 0:
            if message.get("role") == "user" and pending:
                message = {**message, "content": "\n\n".join([*pending, message["content"]])}
                pending = []
            elif pending and message.get("role") == "assistant":
                out.append({"role": "user", "content": "\n\n".join(pending)})
                pending = []
            out.append(message)
            continue
        wrapped = f"<system>\n{message.get('content') or ''}\n</system>"
        if not pending and out and out[-1].get("role") == "user":
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{wrapped}"}
        else:
            pending.append(wrapped)
    if pending:
        out.append({"role": "user", "content": "\n\n".join(pending)})
    return out

// The conversation view: stored messages, the answer being streamed, and the
// actions on the last turn (edit and resend the last question, regenerate the
// last answer). The user's text is shown as typed; the model's is Markdown,
// sanitised (markdown.js). Reasoning sits in a collapsible block, tool calls in
// cards: a coding tool call (--web-tools) shows its approval card, its output as it
// streams and its result; any other call is shown, never run.

import { imageUrl } from "./attachments.js";
import { renderMarkdown } from "./markdown.js";

const el = (tag, className, text) => {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
};

function button(label, onClick, className = "ghost") {
  const b = el("button", className, label);
  b.type = "button";
  b.addEventListener("click", onClick);
  return b;
}

/** "batched · 41.2 tok/s · 12 cached · stopped" for an answer's meta. */
export function describeMeta(meta = {}) {
  const parts = [];
  if (meta.lane) parts.push(meta.lane);
  const stats = meta.stats || {};
  if (stats.tokensPerSecond != null) parts.push(`${stats.tokensPerSecond.toFixed(1)} tok/s`);
  if (meta.usage) parts.push(`${meta.usage.completion_tokens} tokens`);
  const reasons = { length: "cut at max tokens", aborted: "stopped", error: "failed", tool_calls: "tool call" };
  if (reasons[meta.finishReason]) parts.push(reasons[meta.finishReason]);
  return parts.join(" · ");
}

const showArgs = (args) => (typeof args === "string" ? args : JSON.stringify(args, null, 2));

function toolCard(name, args, result) {
  const card = el("div", "tool-call");
  const head = el("div", "tool-head");
  const badge = el("span", "badge", "not run");
  head.append(el("span", "tool-name", `Tool call: ${name}`), badge);
  const pre = el("pre");
  pre.append(el("code", "language-json", showArgs(args)));
  card.append(head, pre);
  if (result) endCard(card, result);
  return card;
}

/** A call's outcome on its card: the badge and the result text. */
function endCard(card, { ok, result }) {
  const badge = card.querySelector(".badge");
  badge.textContent = ok ? "ran" : result.startsWith("not run") ? "not run" : "failed";
  badge.className = `badge ${ok ? "ok" : "failed"}`;
  card.querySelector(".approval")?.remove();
  let out = card.querySelector(".tool-output");
  if (!out) {
    out = el("pre", "tool-output");
    card.append(out);
  }
  out.textContent = result;
}

/**
 * The approval card of a gated call (tool_approval_request): allow, deny, edit
 * the arguments, always allow the tool. ``answer(frame)`` sends the approval.
 */
export function approvalCard(card, frame, answer) {
  const box = el("div", "approval");
  box.setAttribute("role", "group");
  box.setAttribute("aria-label", `Approve ${frame.tool}`);
  box.append(el("span", "question", `Run ${frame.tool}? It runs in the server's workspace.`));
  const always = el("input");
  always.type = "checkbox";
  const alwaysLabel = el("label", "", "");
  alwaysLabel.append(always, `Always allow ${frame.tool}`);
  const editor = el("textarea", "");
  editor.value = showArgs(frame.args);
  editor.hidden = true;
  editor.setAttribute("aria-label", "Arguments to run the call with (JSON)");
  const reply = (decision, extra = {}) => {
    answer({ type: "approval", callId: frame.callId, decision, alwaysAllow: always.checked, ...extra });
    box.querySelectorAll("button, input, textarea").forEach((n) => (n.disabled = true));
    card.querySelector(".badge").textContent = decision === "deny" ? "denied" : "running…";
  };
  const edit = button("Edit", () => {
    if (editor.hidden) {
      editor.hidden = false;
      edit.textContent = "Run edited";
      editor.focus();
      return;
    }
    let args;
    try {
      args = JSON.parse(editor.value);
    } catch {
      args = undefined;
    }
    // the server takes an object only: anything else would leave the card waiting
    if (args === null || typeof args !== "object" || Array.isArray(args)) {
      editor.setCustomValidity("Not a JSON object");
      editor.reportValidity();
      return;
    }
    editor.setCustomValidity("");
    reply("edit", { editedArgs: args });
  });
  box.append(
    button("Allow", () => reply("allow"), "primary approve"),
    button("Deny", () => reply("deny"), "danger deny"),
    edit,
    alwaysLabel,
    editor,
  );
  card.querySelector(".badge").textContent = "awaiting approval";
  card.append(box);
  return box;
}

export class MessageList {
  /**
   * @param {HTMLElement} root the log element.
   * @param {object} actions onEdit(text), onRegenerate(), onSwitch(entryId), modelName().
   */
  constructor(root, actions) {
    this.root = root;
    this.actions = actions;
  }

  clear() {
    this.root.replaceChildren();
  }

  /** Show ``items`` (a history frame's), with actions on the last turn. */
  render(items, running = false) {
    this.clear();
    const lastUser = items.map((m) => m.role).lastIndexOf("user");
    const results = new Map(items.filter((m) => m.role === "tool").map((m) => [m.meta?.toolCallId, m]));
    items.forEach((item, i) => {
      if (item.role === "tool") return; // shown on its call's card
      const node = item.role === "user" ? this.user(item.content, item.meta?.images) : this.assistant(item, results);
      node.dataset.index = i;
      if (item.entryId) node.dataset.entryId = item.entryId;
      if (item.siblings) this.addSiblings(node, item.siblings);
      this.root.append(node);
      if (running) return;
      if (i === lastUser) this.addEdit(node, item.content);
      if (item.role === "assistant" && i === items.length - 1) this.addRegenerate(node);
    });
    this.scroll(true);
  }

  /** A user message: its text as typed and its images (prompt.images, kept in meta.images). */
  user(text, images = []) {
    const node = el("article", "msg user");
    node.append(el("div", "who", "You"));
    if (images?.length) {
      const row = el("div", "images");
      images.forEach((image, i) => {
        const img = document.createElement("img");
        img.src = imageUrl(image);
        img.alt = `image ${i + 1} of ${images.length}`;
        row.append(img);
      });
      node.append(row);
    }
    node.append(el("div", "text", text));
    node.append(el("div", "actions"));
    return node;
  }

  assistant(item, results = new Map()) {
    const node = el("article", "msg assistant");
    node.append(el("div", "who", this.actions.modelName()));
    if (item.reasoning) node.append(this.reasoningBlock(item.reasoning, false));
    const body = el("div", "md body");
    renderMarkdown(body, item.content || "");
    node.append(body);
    const tools = el("div", "tools");
    for (const call of item.toolCalls || []) {
      let args = call.function?.arguments ?? "";
      try {
        args = JSON.parse(args);
      } catch {
        /* shown as written */
      }
      const done = results.get(call.id);
      tools.append(toolCard(call.function?.name ?? "?", args, done && { ok: done.meta?.ok, result: done.content }));
    }
    node.append(tools, el("div", "meta", describeMeta(item.meta)), el("div", "actions"));
    return node;
  }

  reasoningBlock(text, open) {
    const details = el("details", "reasoning");
    details.open = open;
    details.append(el("summary", "", "Thinking"));
    const body = el("div", "md");
    renderMarkdown(body, text, false);
    details.append(body);
    return details;
  }

  /** ``< 2/3 >``: this message's place among its siblings (regenerated or edited). */
  addSiblings(node, { index, count, siblingIds }) {
    const nav = el("span", "siblings");
    nav.setAttribute("role", "group");
    nav.setAttribute("aria-label", "Versions of this message");
    const go = (to) => () => this.actions.onSwitch?.(siblingIds[to]);
    const prev = button("<", go(index - 1), "ghost prev");
    prev.disabled = index === 0;
    prev.setAttribute("aria-label", "Previous version");
    const next = button(">", go(index + 1), "ghost next");
    next.disabled = index === count - 1;
    next.setAttribute("aria-label", "Next version");
    nav.append(prev, el("span", "where", `${index + 1}/${count}`), next);
    node.querySelector(".who").append(nav);
  }

  addEdit(node, text) {
    const actions = node.querySelector(".actions");
    actions.append(button("Edit", () => this.edit(node, text)));
  }

  addRegenerate(node) {
    const actions = node.querySelector(".actions");
    actions.append(
      button("Regenerate", () => this.actions.onRegenerate()),
      button("Copy", async (event) => {
        const text = node.querySelector(".body")?.textContent ?? "";
        try {
          await navigator.clipboard.writeText(text);
          event.target.textContent = "Copied";
        } catch {
          event.target.textContent = "Copy failed";
        }
      }),
    );
  }

  edit(node, text) {
    const box = el("textarea", "edit-box");
    box.value = text;
    box.setAttribute("aria-label", "Edit your message");
    const send = () => box.value.trim() && this.actions.onEdit(box.value);
    const cancel = () => node.replaceWith(this.restore(node, text));
    box.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        send();
      } else if (event.key === "Escape") {
        event.preventDefault();
        cancel();
      }
    });
    const row = el("div", "actions");
    row.append(button("Send", send, "primary"), button("Cancel", cancel));
    node.querySelector(".text").replaceWith(box);
    node.querySelector(".actions").replaceWith(row);
    box.focus();
  }

  restore(node, text) {
    const fresh = this.user(text);
    fresh.dataset.index = node.dataset.index;
    this.addEdit(fresh, text);
    return fresh;
  }

  /** Append the user's message at once, before the server's history confirms it. */
  pending(text, images = []) {
    this.root.append(this.user(text, images));
    this.scroll(true);
  }

  /** A new answer being streamed; returns its controller. */
  startAnswer() {
    const node = el("article", "msg assistant live");
    node.append(el("div", "who", this.actions.modelName()));
    const body = el("div", "md body");
    body.append(el("span", "cursor", "▍"));
    node.append(body, el("div", "tools"), el("div", "meta"), el("div", "actions"));
    this.root.append(node);
    this.scroll(true);
    return new LiveAnswer(this, node);
  }

  /** Keep the newest text in view, unless the reader scrolled up. */
  scroll(force = false) {
    const r = this.root;
    if (force || r.scrollHeight - r.scrollTop - r.clientHeight < 120) r.scrollTop = r.scrollHeight;
  }
}

/** One streaming answer: text and thinking deltas, tool cards, its end. */
class LiveAnswer {
  constructor(list, node) {
    this.list = list;
    this.node = node;
    this.text = "";
    this.reasoning = "";
    this.tools = new Map();
    this.frame = 0;
  }

  text_delta(delta) {
    this.text += delta;
    this.schedule();
  }

  thinking_delta(delta) {
    this.reasoning += delta;
    if (!this.reasoningNode) {
      this.reasoningNode = this.list.reasoningBlock("", true);
      this.node.querySelector(".who").after(this.reasoningNode);
    }
    this.schedule();
  }

  tool_start(frame) {
    const card = toolCard(frame.tool, frame.args);
    card.dataset.callId = frame.callId;
    this.tools.set(frame.callId, { name: frame.tool, args: frame.args });
    this.node.querySelector(".tools").append(card);
  }

  card(callId) {
    return this.node.querySelector(`.tool-call[data-call-id="${CSS.escape(callId)}"]`);
  }

  tool_approval_request(frame, answer) {
    const card = this.card(frame.callId);
    if (card) approvalCard(card, frame, answer);
    this.list.scroll(true);
  }

  tool_update(frame) {
    const card = this.card(frame.callId);
    if (!card) return;
    let out = card.querySelector(".tool-output");
    if (!out) {
      out = el("pre", "tool-output");
      card.append(out);
    }
    out.textContent += frame.chunk;
    out.scrollTop = out.scrollHeight;
    this.list.scroll();
  }

  tool_end(frame) {
    const card = this.card(frame.callId);
    if (card) endCard(card, frame);
    this.ran = this.ran || frame.ok || !frame.result.startsWith("not run");
  }

  // Markdown is rendered at most once per animation frame, code highlighted at the end.
  schedule() {
    if (this.frame) return;
    this.frame = requestAnimationFrame(() => {
      this.frame = 0;
      this.paint(false);
    });
  }

  paint(done) {
    const body = this.node.querySelector(".body");
    renderMarkdown(body, this.text, done);
    if (!done) body.append(el("span", "cursor", "▍"));
    if (this.reasoningNode) renderMarkdown(this.reasoningNode.querySelector(".md"), this.reasoning, false);
    this.list.scroll();
  }

  /** The turn ended: final render, meta line, actions; returns the history item. */
  finish(end) {
    cancelAnimationFrame(this.frame);
    this.frame = 0;
    this.paint(true);
    this.node.classList.remove("live");
    if (this.reasoningNode && this.text) this.reasoningNode.open = false;
    const meta = { finishReason: end.finishReason, lane: end.lane, usage: end.usage, stats: end.stats };
    this.node.querySelector(".meta").textContent = describeMeta(meta);
    const toolCalls = [...this.tools].map(([id, t]) => ({
      id,
      type: "function",
      function: { name: t.name, arguments: typeof t.args === "string" ? t.args : JSON.stringify(t.args) },
    }));
    return { role: "assistant", content: this.text, reasoning: this.reasoning || undefined, toolCalls, meta };
  }
}

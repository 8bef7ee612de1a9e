// The web chat: wiring between the socket, the conversation view, the session
// list, the composer, the stats strip and the dialogs. Plain ES modules, no
// build step; everything is same-origin.
//
// The open conversation lives in the URL (#chat/<id>; #chat is a blank one), so
// reload, back, forward and bookmarks find it. An error stays on screen until the
// user acts (sends, edits, regenerates, dismisses it, switches chat).

import { AdapterChip } from "./adapters.js";
import { navigate, snapshot, spotlight } from "./assistant.js";
import { MessageList } from "./messages.js";
import { wireAttachments } from "./attachments.js";
import { wireMic } from "./mic.js";
import { SettingsDialog, askKey, modelInfo, showStatus } from "./panels.js";
import { wireSearch } from "./search.js";
import { ChatConnection } from "./socket.js";
import { hashSession, onChatRoute, showBlankInUrl, syncUrl } from "./url.js";

const $ = (selector) => document.querySelector(selector);

const state = {
  ready: null,
  model: { id: null, context: null },
  sessionId: null,
  settings: { systemPrompt: null, sampling: {}, thinking: null, tools: [], adapter: null },
  items: [],
  sessions: [],
  running: false,
  live: null,
  pendingText: null, // a sent prompt the server has not started answering yet
  pendingImages: [], // its images (prompt.images)
};

// The session the URL asked for (load, back, forward), until its history (or
// the error that it does not exist) arrives.
const nav = { opening: null };

const list = new MessageList($("#messages"), {
  onEdit: (text) => {
    notice("");
    state.branching = true;
    send({ type: "edit_resend", text });
  },
  onRegenerate: () => {
    notice("");
    state.branching = true;
    send({ type: "regenerate" });
  },
  onSwitch: (entryId) => {
    notice("");
    if (!state.running) send({ type: "switch_sibling", entryId });
  },
  modelName: () => state.model.id || state.ready?.model || "Model",
});

const settingsDialog = new SettingsDialog($("#settings-dialog"), (chosen) => {
  send({ type: "set_system_prompt", text: chosen.systemPrompt });
  send({ type: "set_sampling", scope: "session", ...chosen.sampling });
  if (state.ready?.thinking) send({ type: "set_thinking", enabled: chosen.thinking });
  send({ type: "set_tools", tools: chosen.tools });
  state.settings = { ...state.settings, ...chosen }; // the adapter is the chip's
  showSettingsSummary();
});

const adapterChip = new AdapterChip($("#adapter-picker"), (adapter) => {
  send({ type: "set_adapter", id: adapter });
  state.settings = { ...state.settings, adapter };
});

// images for the next prompt: pasted, dropped or picked (a vision model)
const attachments = wireAttachments({
  composer: $("#composer"),
  box: $("#prompt"),
  tray: $("#attachments"),
  pick: $("#attach"),
  input: $("#attach-input"),
  notice: (text) => notice(text),
  enabled: () => Boolean(state.ready?.vision),
});

const connection = new ChatConnection({
  onFrame,
  onState: (s) => {
    const chip = $("#connection");
    chip.dataset.state = s;
    chip.textContent = { connecting: "connecting…", open: "", closed: "offline, reconnecting…" }[s];
    if (s !== "open") setRunning(false);
  },
  askKey: (message) => askKey($("#key-dialog"), message),
});

function send(frame) {
  if (!connection.send(frame)) notice("Not connected: the message was not sent.");
}

/** Show an error (or, with "", take it away): it stays until the user acts. */
function notice(text) {
  $("#notice-text").textContent = text;
  $("#notice").hidden = !text;
}

// --------------------------------------------------------------------- URL

/** Show what the URL names (back, forward, an edited address). */
function followUrl() {
  if (!onChatRoute()) return;
  const id = hashSession();
  if (id === state.sessionId) return;
  notice("");
  if (id) {
    nav.opening = id;
    send({ type: "open_session", path: id });
  } else {
    send({ type: "new_session" });
  }
}

// ------------------------------------------------------------------- frames

const handlers = {
  ready(frame) {
    state.ready = frame;
    showModel();
    $("#mic").hidden = !frame.transcription; // a Whisper checkpoint serves /v1/audio/sessions
    attachments.show(Boolean(frame.vision)); // the image button: a vision model only
    adapterChip.refresh(frame.defaultAdapter);
    $("#coding-tools").hidden = !frame.codingTools; // the server has a --web-tools workspace
    sendContext();
    $("#prompt").disabled = false;
    if (document.activeElement === document.body) $("#prompt").focus(); // autofocus skipped it while disabled
    const want = state.sessionId || nav.opening; // a reconnect, or the URL's session
    if (want) {
      nav.opening = want;
      connection.send({ type: "open_session", path: want });
    }
  },
  sessions(frame) {
    state.sessions = frame.items;
    renderSessions();
  },
  history(frame) {
    if (!nav.opening || frame.sessionId === nav.opening) {
      nav.opening = null; // not the greeting's blank chat before the URL's session
      syncUrl(frame.sessionId);
    }
    state.sessionId = frame.sessionId;
    state.settings = frame.settings;
    state.items = frame.items;
    list.render(state.items, state.running);
    renderSessions();
    showSettingsSummary();
    adapterChip.show(frame.settings.adapter);
    showCodingTools(frame.settings.codingTools, false);
    if (!frame.sessionId) resetStrip();
  },
  turn_start(frame) {
    state.pendingText = null;
    state.pendingImages = [];
    setRunning(true);
    state.live = list.startAnswer();
    $("#strip").dataset.sampling = JSON.stringify(frame.sampling);
    $("#strip").dataset.adapter = frame.adapter ?? "";
  },
  text_delta: (frame) => state.live?.text_delta(frame.delta),
  thinking_delta: (frame) => state.live?.thinking_delta(frame.delta),
  tool_start: (frame) => state.live?.tool_start(frame),
  tool_end: (frame) => state.live?.tool_end(frame),
  tool_approval_request: (frame) => state.live?.tool_approval_request(frame, send),
  tool_update: (frame) => state.live?.tool_update(frame),
  tool_approvals(frame) {
    notice(`Always allowed from now on: ${frame.alwaysAllow.join(", ")} (forget them with DELETE /api/settings/tool-approvals).`);
  },
  ui_navigate: (frame) => navigate(frame),
  ui_spotlight: (frame) => spotlight(frame),
  queue_update(frame) {
    const box = $("#queue");
    box.replaceChildren();
    for (const [kind, label] of [["steering", "steering"], ["followUp", "next"]]) {
      for (const text of frame[kind]) {
        const row = document.createElement("div");
        const tag = document.createElement("span");
        tag.className = "kind";
        tag.textContent = `${label}:`;
        row.append(tag, text);
        box.append(row);
      }
    }
    box.hidden = !box.childElementCount;
  },
  coding_tools(frame) {
    showCodingTools(frame.pending ?? frame.active, frame.pending != null);
  },
  turn_end(frame) {
    if (state.live) {
      const ran = state.live.ran; // tools ran: the stored turn has their results
      state.items.push(state.live.finish(frame));
      state.live = null;
      // tools ran, or a regenerate/edit made a sibling: show the stored turn (its < n/m >)
      if ((ran || state.branching) && state.sessionId) send({ type: "open_session", path: state.sessionId });
      state.branching = false;
    }
    setRunning(false);
    list.render(state.items);
    if (state.pendingText != null) {
      restoreDraft(state.pendingText); // refused: nothing was stored
      attachments.restore(state.pendingImages);
    }
    state.pendingText = null;
    showStrip(frame);
  },
  context(frame) {
    const meter = $("#context-meter");
    meter.max = frame.contextWindow;
    meter.value = frame.tokens;
    $("#stat-context").textContent = `${frame.tokens} / ${frame.contextWindow} tokens (${frame.percent}%)`;
  },
  error(frame) {
    if (nav.opening && (frame.param === "path" || frame.param === "id")) {
      // the URL's session is not here (deleted, or another server's): a new chat
      const id = nav.opening;
      nav.opening = null;
      showBlankInUrl();
      send({ type: "new_session" });
      notice(`No conversation ${id} here (deleted, or another server's): this is a new chat.`);
      return;
    }
    notice(frame.message);
  },
};

/** Tell the server what the page shows (the app-aware assistant's context). */
function sendContext() {
  requestAnimationFrame(() => connection.send({ type: "context", context: snapshot() }));
}

function onFrame(frame) {
  handlers[frame.type]?.(frame); // an error stays until the user acts
}

// ---------------------------------------------------------------- rendering

function showModel() {
  const id = state.model.id || state.ready?.model || "";
  const context = state.model.context || state.ready?.contextWindow;
  $("#model-name").textContent = id;
  $("#model-context").textContent = context ? `context ${context.toLocaleString()}` : "";
  document.title = id ? `${id} · mlxspec` : "mlxspec chat";
}

function renderSessions() {
  const ul = $("#session-list");
  ul.replaceChildren();
  for (const s of state.sessions) {
    const li = document.createElement("li");
    li.className = s.id === state.sessionId ? "active" : "";
    const open = document.createElement("button");
    open.type = "button";
    open.className = "session";
    open.dataset.id = s.id;
    open.setAttribute("aria-current", s.id === state.sessionId ? "page" : "false");
    const title = document.createElement("span");
    title.className = "title";
    title.textContent = s.title;
    const when = document.createElement("small");
    when.textContent = `${new Date(s.updated * 1000).toLocaleString()} · ${s.messages} messages`;
    open.append(title, when);
    open.addEventListener("click", () => {
      notice("");
      send({ type: "open_session", path: s.id });
      closeSidebarOnPhone();
    });
    const fork = iconButton("fork", `Fork “${s.title}”`, () => send({ type: "fork_session", path: s.id }));
    const del = iconButton("delete", `Delete “${s.title}”`, () => {
      if (confirm(`Delete “${s.title}”?`)) send({ type: "delete_session", path: s.id });
    });
    li.append(open, fork, del);
    ul.append(li);
  }
  $("#no-sessions").hidden = state.sessions.length > 0;
}

// 16x16 stroke icons, drawn here so no font lacks the glyph.
const ICONS = {
  fork: "M5.5 5.5h7v7h-7zM3.5 10.5v-7h7",
  delete: "M3.5 4.5h9M6.5 4.5V3h3v1.5M5 4.5l.6 8.5h4.8l.6-8.5",
  close: "M4 4l8 8M12 4l-8 8",
};

function icon(name) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("viewBox", "0 0 16 16");
  svg.setAttribute("width", "16");
  svg.setAttribute("height", "16");
  svg.setAttribute("aria-hidden", "true");
  const path = document.createElementNS("http://www.w3.org/2000/svg", "path");
  path.setAttribute("d", ICONS[name]);
  path.setAttribute("fill", "none");
  path.setAttribute("stroke", "currentColor");
  path.setAttribute("stroke-width", "1.5");
  path.setAttribute("stroke-linecap", "round");
  svg.append(path);
  return svg;
}

function iconButton(name, label, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = `icon ${name}`;
  b.append(icon(name));
  b.title = label;
  b.setAttribute("aria-label", label);
  b.addEventListener("click", onClick);
  return b;
}

function showSettingsSummary() {
  const s = state.settings;
  const parts = Object.entries(s.sampling || {})
    .filter(([, v]) => v != null)
    .map(([k, v]) => `${k} ${v}`);
  if (s.systemPrompt) parts.unshift("system prompt");
  if (s.thinking != null) parts.push(`thinking ${s.thinking ? "on" : "off"}`);
  if (s.tools?.length) parts.push(`${s.tools.length} tools`);
  $("#settings-summary").textContent = parts.length ? parts.join(", ") : "server defaults";
}

function showCodingTools(on, pending) {
  const chip = $("#coding-tools");
  chip.setAttribute("aria-pressed", String(Boolean(on)));
  chip.textContent = `tools: ${on ? "on" : "off"}${pending ? " (next turn)" : ""}`;
}

function setRunning(running) {
  state.running = running;
  $("#send").hidden = running;
  $("#stop").hidden = !running;
  document.body.classList.toggle("running", running);
  $("#messages").setAttribute("aria-busy", String(running)); // read the answer once it is whole
}

function resetStrip() {
  for (const id of ["#stat-tps", "#stat-ttft", "#stat-cached", "#stat-lane"]) $(id).textContent = "—";
}

function showStrip(end) {
  const stats = end.stats || {};
  $("#stat-tps").textContent = stats.tokensPerSecond != null ? `${stats.tokensPerSecond.toFixed(1)} tok/s` : "—";
  $("#stat-ttft").textContent = stats.ttftMs != null ? `${Math.round(stats.ttftMs)} ms` : "—";
  $("#stat-cached").textContent = stats.cachedTokens != null ? `${stats.cachedTokens}` : "—";
  $("#stat-lane").textContent = end.lane || "—";
}

// ----------------------------------------------------------------- composer

function submitPrompt(steer = false) {
  const box = $("#prompt");
  const text = box.value;
  if (!text.trim()) return;
  if (state.running) {
    if (attachments.pending()) {
      notice("Images are sent with a new message once this answer ends.");
      return;
    }
    // queued by the server: steering joins this turn's next step, a follow-up runs after it
    if (connection.send({ type: "prompt", text, queue: steer ? "steering" : "followUp" })) {
      box.value = "";
      autosize();
    } else notice("Not connected: the message was not sent.");
    return;
  }
  const images = attachments.take();
  if (!connection.send(images.length ? { type: "prompt", text, images } : { type: "prompt", text })) {
    attachments.restore(images);
    notice("Not connected: the message was not sent.");
    return;
  }
  notice("");
  state.pendingText = text;
  state.pendingImages = images;
  box.value = "";
  autosize();
  list.pending(text, images);
  setRunning(true); // Stop (and Esc) work before the answer's first frame
}

/** Give a refused prompt back to the composer, unless the user typed anew. */
function restoreDraft(text) {
  const box = $("#prompt");
  if (box.value.trim()) return;
  box.value = text;
  autosize();
}

function autosize() {
  const box = $("#prompt");
  box.style.height = "auto";
  box.style.height = `${Math.min(box.scrollHeight, 240)}px`;
}

/** Put a transcript at the caret (not sent: the person reads it first). */
function insertTranscript(text) {
  const box = $("#prompt");
  const before = box.value.slice(0, box.selectionStart);
  const after = box.value.slice(box.selectionEnd);
  const lead = before && !/\s$/.test(before) ? " " : "";
  const trail = after && !/^\s/.test(after) ? " " : "";
  box.value = before + lead + text + trail + after;
  const caret = (before + lead + text).length;
  box.focus();
  box.setSelectionRange(caret, caret);
  autosize();
}

function stop() {
  send({ type: "abort" });
}

function newChat() {
  notice("");
  send({ type: "new_session" });
  closeSidebarOnPhone();
  $("#prompt").focus();
}

function closeSidebarOnPhone() {
  if (matchMedia("(max-width: 720px)").matches) toggleSidebar(false);
}

function toggleSidebar(open) {
  const shown = open ?? !document.body.classList.contains("sidebar-open");
  document.body.classList.toggle("sidebar-open", shown);
  $("#toggle-sidebar").setAttribute("aria-expanded", String(shown));
}

function route() {
  const status = location.hash === "#status";
  $("#chat-view").hidden = status;
  $("#status-view").hidden = !status;
  if (status) showStatus($("#status-view"));
}

// -------------------------------------------------------------------- start

function wire() {
  const box = $("#prompt");
  $("#composer").addEventListener("submit", (event) => {
    event.preventDefault();
    submitPrompt();
  });
  box.addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      submitPrompt(event.ctrlKey || event.metaKey);
    } else if (event.key === "Escape" && state.running) {
      event.preventDefault();
      stop();
    }
  });
  box.addEventListener("input", autosize);
  $("#stop").addEventListener("click", stop);
  $("#coding-tools").addEventListener("click", () => {
    const on = $("#coding-tools").getAttribute("aria-pressed") !== "true";
    send({ type: "set_coding_tools", enabled: on });
  });
  wireMic($("#mic"), { insert: insertTranscript, notice });
  $("#new-chat").addEventListener("click", newChat);
  wireSearch($("#session-search"), $("#search-results"), document.querySelector(".sessions"), (path) => {
    notice("");
    send({ type: "open_session", path });
    closeSidebarOnPhone();
  });
  $("#toggle-sidebar").addEventListener("click", () => toggleSidebar());
  $("#open-settings").addEventListener("click", () =>
    settingsDialog.open(state.settings, state.ready?.genDefaults, state.ready?.thinking),
  );
  document.addEventListener("keydown", (event) => {
    const mod = event.ctrlKey || event.metaKey;
    if (mod && event.shiftKey && event.key.toLowerCase() === "o") {
      event.preventDefault();
      newChat();
    } else if (event.key === "/" && document.activeElement === document.body) {
      event.preventDefault();
      box.focus();
    }
  });
  $("#dismiss-notice").append(icon("close"));
  $("#dismiss-notice").addEventListener("click", () => notice(""));
  window.addEventListener("hashchange", () => {
    route();
    followUrl();
    sendContext();
  });
}

async function start() {
  wire();
  route();
  nav.opening = hashSession(); // opened once the socket is ready
  connection.connect();
  state.model = await modelInfo();
  showModel();
  if ("serviceWorker" in navigator && window.isSecureContext) {
    navigator.serviceWorker.register("/sw.js").catch(() => {});
  }
}

start();

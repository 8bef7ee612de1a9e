// The dialogs and views beside the conversation: per-session settings, the
// API key prompt, and the status view (/fit and /stats).

import { authHeaders } from "./socket.js";

/** The sampling fields the settings dialog edits: [name, label, kind, min, max, step]. */
export const SAMPLING = [
  ["temperature", "Temperature", "number", 0, null, 0.05],
  ["top_p", "Top p", "number", 0, 1, 0.01],
  ["top_k", "Top k", "integer", 0, null, 1],
  ["min_p", "Min p", "number", 0, 1, 0.01],
  ["max_tokens", "Max tokens", "integer", 1, null, 1],
  ["seed", "Seed", "integer", 0, null, 1],
  ["frequency_penalty", "Frequency penalty", "number", -2, 2, 0.1],
  ["presence_penalty", "Presence penalty", "number", -2, 2, 0.1],
  ["repetition_penalty", "Repetition penalty", "number", 0, 100, 0.05],
];

export class SettingsDialog {
  /**
   * @param {HTMLDialogElement} dialog the <dialog> of index.html.
   * @param {function} onSave called with {systemPrompt, sampling, thinking, tools}.
   */
  constructor(dialog, onSave) {
    this.dialog = dialog;
    this.onSave = onSave;
    this.fields = dialog.querySelector("#sampling-fields");
    for (const [name, label, kind, min, max, step] of SAMPLING) {
      const wrap = document.createElement("label");
      wrap.className = "field";
      wrap.textContent = label;
      const input = document.createElement("input");
      input.type = "number";
      input.name = name;
      input.id = `setting-${name}`;
      input.step = String(step);
      input.inputMode = kind === "integer" ? "numeric" : "decimal";
      if (min !== null) input.min = String(min);
      if (max !== null) input.max = String(max);
      wrap.append(input);
      this.fields.append(wrap);
    }
    dialog.querySelector("form").addEventListener("submit", (event) => {
      if (event.submitter?.value !== "save") return;
      const chosen = this.read();
      if (chosen === null) event.preventDefault(); // the tools are not JSON: stay open
      else this.onSave(chosen);
    });
    dialog.querySelector("#settings-reset").addEventListener("click", () => {
      this.fill({ systemPrompt: null, sampling: {}, thinking: null, tools: [] });
    });
  }

  /** Show the dialog with ``settings``; ``defaults`` (ready.genDefaults) as placeholders. */
  open(settings, defaults = {}, thinkingAvailable = false) {
    this.fill(settings, defaults);
    this.dialog.querySelector("#thinking-field").hidden = !thinkingAvailable;
    this.dialog.showModal();
    this.dialog.querySelector("#system-prompt").focus();
  }

  fill(settings, defaults = {}) {
    this.dialog.querySelector("#system-prompt").value = settings.systemPrompt || "";
    for (const [name] of SAMPLING) {
      const input = this.fields.querySelector(`[name="${name}"]`);
      const value = settings.sampling?.[name];
      input.value = value ?? "";
      input.placeholder = defaults[name] != null ? `default ${defaults[name]}` : "default";
    }
    const tools = settings.tools || [];
    this.dialog.querySelector("#tools").value = tools.length ? JSON.stringify(tools, null, 2) : "";
    this.dialog.querySelector("#tools-error").hidden = true;
    const thinking = settings.thinking;
    this.dialog.querySelector("#thinking").value = thinking == null ? "default" : thinking ? "on" : "off";
  }

  read() {
    const sampling = {};
    for (const [name, , kind] of SAMPLING) {
      const raw = this.fields.querySelector(`[name="${name}"]`).value.trim();
      sampling[name] = raw === "" ? null : kind === "integer" ? Number.parseInt(raw, 10) : Number(raw);
    }
    const choice = this.dialog.querySelector("#thinking").value;
    const raw = this.dialog.querySelector("#tools").value.trim();
    let tools = [];
    try {
      tools = raw ? JSON.parse(raw) : [];
      if (!Array.isArray(tools)) throw new Error("not an array");
    } catch (error) {
      const box = this.dialog.querySelector("#tools-error");
      box.textContent = `Tools must be a JSON array (${error.message}).`;
      box.hidden = false;
      return null;
    }
    return {
      systemPrompt: this.dialog.querySelector("#system-prompt").value.trim() || null,
      sampling,
      thinking: choice === "default" ? null : choice === "on",
      tools,
    };
  }
}

/** Ask for the API key once; resolves with what was typed. */
export function askKey(dialog, message) {
  dialog.querySelector("#key-message").textContent = message;
  const input = dialog.querySelector("#api-key");
  input.value = "";
  dialog.showModal();
  input.focus();
  return new Promise((resolve) => {
    dialog.addEventListener("close", () => resolve(input.value.trim()), { once: true });
  });
}

async function getJson(path) {
  const response = await fetch(path, { headers: authHeaders() });
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.json();
}

/** The served model's id and context window, from /v1/models and /fit. */
export async function modelInfo() {
  const [models, fit] = await Promise.allSettled([getJson("/v1/models"), getJson("/fit")]);
  const model = models.status === "fulfilled" ? models.value.data?.[0] : null;
  const report = fit.status === "fulfilled" ? fit.value : null;
  return {
    id: model?.id ?? null,
    context: report?.context_tokens ?? model?.context_window ?? null,
    fit: report,
  };
}

function row(table, label, value) {
  const tr = document.createElement("tr");
  const th = document.createElement("th");
  th.scope = "row";
  th.textContent = label;
  const td = document.createElement("td");
  td.textContent = value ?? "—";
  tr.append(th, td);
  table.append(tr);
}

const gib = (bytes) => (bytes == null ? null : `${(bytes / 2 ** 30).toFixed(1)} GiB`);

/** Fill the status view (#status) from /fit and /stats. */
export async function showStatus(view) {
  const table = view.querySelector("#status-table");
  table.replaceChildren();
  const [fit, stats] = await Promise.allSettled([getJson("/fit"), getJson("/stats")]);
  if (fit.status === "fulfilled") {
    const f = fit.value;
    row(table, "Device", f.device);
    row(table, "CPU", `${f.machine?.cpu ?? "?"} (${f.machine?.cpu_count ?? "?"} cores)`);
    row(table, "Memory", `${gib(f.machine?.available_bytes)} free of ${gib(f.machine?.ram_bytes)}`);
    row(table, "Context", `${f.context_tokens} tokens`);
    row(table, "Predicted decode", `${f.typical_decode_tps} tokens/s`);
  }
  if (stats.status === "fulfilled") {
    const s = stats.value;
    row(table, "Model", s.server?.model);
    row(table, "Uptime", `${Math.round(s.server?.uptime_s ?? 0)} s`);
    row(table, "Running / waiting", `${s.admission?.in_flight ?? 0} / ${s.admission?.queue_depth ?? 0}`);
    const r = s.requests || {};
    row(table, "Requests", `${r.submitted} submitted, ${r.completed} completed, ${r.cancelled} cancelled, ${r.failed} failed`);
  }
  if (fit.status !== "fulfilled" && stats.status !== "fulfilled") row(table, "Status", "unavailable");
}

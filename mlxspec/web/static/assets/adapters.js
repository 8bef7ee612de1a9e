// The adapter chip: which LoRA adapter this chat's turns generate with.
//
// The list comes from GET /v1/adapters (mounted: selectable) and
// GET /v1/adapters/available (folders on disk: greyed out unless mounted, with a
// title saying what to do), read again each time the list opens. A choice is a
// set_adapter frame; the session keeps it (history.settings.adapter). null is the
// server's default: ready.defaultAdapter (--adapter-path) while mounted, else the
// base model.

import { authHeaders } from "./socket.js";

async function getJson(path) {
  const response = await fetch(path, { headers: authHeaders() });
  if (!response.ok) throw new Error(`${path}: ${response.status}`);
  return response.json();
}

/** Why a folder on disk cannot be chosen, and what to do about it. */
function unmountedTitle(row) {
  if (!row.compatible) {
    return `Trained on ${row.base_model}, not on the served model: it cannot be mounted here.`;
  }
  return `Not mounted. Mount it with POST /v1/adapters {"id": "${row.id}", "path": "${row.path}"} or start the server with --adapter-path ${row.path}.`;
}

export class AdapterChip {
  /**
   * @param {HTMLElement} root the #adapter-picker of index.html (chip + menu).
   * @param {function} onSelect called with the chosen spec (an id, "none", or null).
   */
  constructor(root, onSelect) {
    this.root = root;
    this.chip = root.querySelector("#adapter-chip");
    this.menu = root.querySelector("#adapter-menu");
    this.onSelect = onSelect;
    this.current = null;
    this.defaultId = null;
    this.mounted = [];
    this.available = [];
    this.chip.addEventListener("click", () => (this.menu.hidden ? this.open() : this.close()));
    this.menu.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        this.close();
        this.chip.focus();
      }
    });
    document.addEventListener("click", (event) => {
      if (!this.menu.hidden && !root.contains(event.target)) this.close();
    });
  }

  /** Read both lists again; the chip hides when there is no adapter at all. */
  async refresh(defaultId = this.defaultId) {
    this.defaultId = defaultId;
    const [mounted, available] = await Promise.allSettled([
      getJson("/v1/adapters"),
      getJson("/v1/adapters/available"),
    ]);
    this.mounted = mounted.status === "fulfilled" ? mounted.value.adapters : [];
    this.available = available.status === "fulfilled" ? available.value.adapters : [];
    this.root.hidden = !this.mounted.length && !this.available.length;
    this.show(this.current);
  }

  /** Show the session's choice (history.settings.adapter). */
  show(spec) {
    this.current = spec ?? null;
    const ids = this.mounted.map((a) => a.id);
    const effective = spec === "none" ? null : spec ?? (ids.includes(this.defaultId) ? this.defaultId : null);
    this.chip.textContent = `adapter: ${effective ?? "base"}`;
    this.chip.dataset.adapter = effective ?? "";
    this.chip.title = spec == null ? "The server's default adapter (click to choose)" : "This chat's LoRA adapter (click to choose)";
  }

  async open() {
    await this.refresh();
    this.render();
    this.menu.hidden = false;
    this.chip.setAttribute("aria-expanded", "true");
    this.menu.querySelector("[role=menuitemradio]:not([aria-disabled=true])")?.focus();
  }

  close() {
    this.menu.hidden = true;
    this.chip.setAttribute("aria-expanded", "false");
  }

  render() {
    this.menu.replaceChildren();
    if (this.defaultId && this.mounted.some((a) => a.id === this.defaultId)) {
      this.item(null, `default (${this.defaultId})`, "The server's --adapter-path adapter");
    }
    for (const a of this.mounted) this.item(a.id, a.id, `rank ${a.rank}, scale ${a.scale}, ${a.mounted_layers} layers`);
    for (const row of this.available) {
      if (row.mounted) continue; // listed above, under the id it was mounted as
      this.item(row.id, row.id, unmountedTitle(row), true);
    }
    this.item("none", "none (base model)", "Generate without any adapter");
  }

  item(spec, label, title, greyed = false) {
    const b = document.createElement("button");
    b.type = "button";
    b.setAttribute("role", "menuitemradio");
    b.setAttribute("aria-checked", String(!greyed && spec === this.current));
    b.textContent = label;
    b.title = title;
    b.dataset.adapter = spec ?? "";
    if (greyed) {
      // aria-disabled, not disabled: the title still shows on hover and focus
      b.setAttribute("aria-disabled", "true");
      b.className = "greyed";
    } else {
      b.addEventListener("click", () => {
        this.close();
        this.show(spec);
        this.onSelect(spec);
        this.chip.focus();
      });
    }
    this.menu.append(b);
  }
}

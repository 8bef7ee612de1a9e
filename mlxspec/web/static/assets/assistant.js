// The app-aware assistant's side of the page: a structured snapshot of what the
// page shows (the `context` frame, sent on every route change, never on a
// timer) and the model's two actions on it: `ui_navigate` (go to a route) and
// `ui_spotlight` (a brief, non-blocking highlight of one element). No
// screenshot is taken: the snapshot lists the visible interactive elements.

const MAX_ELEMENTS = 120;
const ROUTES = ["chat", "status"];
// The conversation itself is not the app's chrome: its buttons are left out.
const SKIP = "#messages, #search-results, .approval";

let refs = new Map(); // ref -> element, from the last snapshot

export function currentRoute() {
  const route = (location.hash.replace(/^#/, "").split("/")[0] || "chat").toLowerCase();
  return ROUTES.includes(route) ? route : "chat";
}

function labelOf(node) {
  return (
    node.getAttribute("aria-label") ||
    node.textContent.trim() ||
    node.getAttribute("title") ||
    node.getAttribute("placeholder") ||
    ""
  )
    .replace(/\s+/g, " ")
    .trim()
    .slice(0, 120);
}

function visible(node) {
  if (node.closest("[hidden]") || node.closest(SKIP)) return false;
  const box = node.getBoundingClientRect();
  return box.width > 0 && box.height > 0;
}

/** The `context` frame's context: route and the visible interactive elements. */
export function snapshot() {
  refs = new Map();
  const elements = [];
  for (const node of document.querySelectorAll("button, a[href], input, textarea, select, [role=button]")) {
    if (!visible(node) || elements.length >= MAX_ELEMENTS) continue;
    const ref = `r${elements.length}`;
    refs.set(ref, node);
    const item = { ref, label: labelOf(node), kind: node.tagName.toLowerCase() };
    if (node.getAttribute("role")) item.role = node.getAttribute("role");
    item.selector = node.id ? `#${node.id}` : `[data-assistant-ref="${ref}"]`;
    node.dataset.assistantRef = ref;
    if (node.id) item.spotlightId = node.id;
    elements.push(item);
  }
  const route = currentRoute();
  return { route, snapshot: { route, capturedAt: new Date().toISOString(), elements } };
}

function resolve(frame) {
  if (frame.ref && refs.get(frame.ref)?.isConnected) return refs.get(frame.ref);
  if (frame.selector) {
    try {
      const found = document.querySelector(frame.selector);
      if (found) return found;
    } catch {
      /* not a selector: try the label */
    }
  }
  const wanted = (frame.label || "").toLowerCase();
  if (wanted) {
    for (const node of refs.values()) if (node.isConnected && labelOf(node).toLowerCase().includes(wanted)) return node;
  }
  if (frame.target) return document.getElementById(frame.target) || document.querySelector(`[data-spotlight-id="${CSS.escape(frame.target)}"]`);
  return null;
}

/** Apply `ui_spotlight`: outline the element for a few seconds, with the model's message. */
export function spotlight(frame) {
  const node = resolve(frame);
  if (!node) return false;
  node.scrollIntoView({ block: "nearest" });
  node.classList.add("spotlight");
  let tip = null;
  if (frame.message) {
    tip = document.createElement("div");
    tip.className = "spotlight-tip";
    tip.setAttribute("role", "status");
    tip.textContent = frame.message;
    const box = node.getBoundingClientRect();
    tip.style.left = `${Math.max(8, box.left)}px`;
    tip.style.top = `${Math.max(8, box.top - 36)}px`;
    document.body.append(tip);
  }
  setTimeout(() => {
    node.classList.remove("spotlight");
    tip?.remove();
  }, 3000);
  return true;
}

/** Apply `ui_navigate`: the page's own hash route. */
export function navigate(frame) {
  if (ROUTES.includes(frame.route) && currentRoute() !== frame.route) location.hash = `#${frame.route}`;
}

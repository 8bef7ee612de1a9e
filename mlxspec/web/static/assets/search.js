// The sessions panel's search box: GET /api/sessions/search while there is a
// query (debounced); the results replace the conversation list. The server sends
// plain-text snippets and [start, end) ranges: the text is set as text and each
// range wrapped in <mark> here, so no snippet is ever parsed as markup.

import { authHeaders } from "./socket.js";

const el = (tag, className, text) => {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
};

/**
 * The snippet as nodes, each range marked. The server counts ranges in code points
 * (Python's str), so the snippet is sliced as an array of code points, not UTF-16
 * units (an emoji before a match would shift it, or split a surrogate pair).
 */
export function markedSnippet(snippet, ranges) {
  const out = el("span", "snippet");
  const points = Array.from(snippet);
  const part = (from, to) => points.slice(from, to).join("");
  let at = 0;
  for (const [start, end] of ranges) {
    if (start < at) continue;
    out.append(document.createTextNode(part(at, start)), el("mark", "", part(start, end)));
    at = end;
  }
  out.append(document.createTextNode(part(at)));
  return out;
}

/**
 * @param {HTMLInputElement} box the search field.
 * @param {HTMLElement} results where the results go.
 * @param {HTMLElement} list the conversation list (hidden while results show).
 * @param {(path: string) => void} open opens a session.
 */
export function wireSearch(box, results, list, open) {
  let timer = 0;
  let asked = 0;
  const show = (searching) => {
    results.hidden = !searching;
    list.hidden = searching;
  };
  const run = async () => {
    const q = box.value.trim();
    if (!q) {
      show(false);
      return;
    }
    const mine = ++asked;
    let body;
    try {
      const r = await fetch(`/api/sessions/search?q=${encodeURIComponent(q)}`, { headers: authHeaders() });
      body = await r.json();
      if (!r.ok) throw new Error(body?.error?.message || r.statusText);
    } catch (error) {
      if (mine === asked) results.replaceChildren(el("p", "muted", `Search failed: ${error.message}`));
      show(true);
      return;
    }
    if (mine !== asked) return; // a newer query is on its way
    results.replaceChildren();
    if (!body.results.length) results.append(el("p", "muted", "No message matches."));
    for (const found of body.results) {
      const section = el("section", "result");
      section.append(el("h3", "", found.sessionTitle));
      for (const match of found.matches) {
        const b = el("button", "ghost match");
        b.type = "button";
        b.append(el("small", "muted", match.role === "user" ? "You: " : "Model: "), markedSnippet(match.snippet, match.ranges));
        b.addEventListener("click", () => open(found.sessionPath));
        section.append(b);
      }
      results.append(section);
    }
    show(true);
  };
  box.addEventListener("input", () => {
    clearTimeout(timer);
    timer = setTimeout(run, 250);
  });
  box.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      box.value = "";
      show(false);
    }
  });
}

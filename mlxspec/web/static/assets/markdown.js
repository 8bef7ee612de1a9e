// Markdown -> safe DOM for the model's text.
//
// marked (vendored, MIT) turns Markdown into HTML; the model's raw HTML is
// escaped (shown as text, never parsed), and the result then goes through an
// allow-list sanitiser: the HTML is parsed into an inert document (DOMParser
// runs no scripts and loads nothing) and only known tags and attributes are
// copied out, links only with http(s)/mailto targets. Images are never loaded
// (a model could beacon a URL): they become links. Code blocks are
// highlighted by highlight.js (vendored, BSD-3-Clause) when asked.

import { Marked } from "./marked.esm.js";

const escapeHtml = (text) =>
  text.replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

const marked = new Marked({
  gfm: true,
  breaks: false,
  renderer: {
    // Raw HTML in the model's text is text.
    html({ text }) {
      return escapeHtml(text);
    },
    image({ href, text }) {
      const label = escapeHtml(text || href || "image");
      return `<a href="${escapeHtml(href || "")}">[image: ${label}]</a>`;
    },
  },
});

// Tag -> attributes kept. Everything else is dropped (its text kept).
const ALLOWED = {
  A: ["href", "title"], P: [], BR: [], HR: [], EM: [], STRONG: [], DEL: [], S: [],
  CODE: ["class"], PRE: [], BLOCKQUOTE: [], UL: [], OL: ["start"], LI: [],
  H1: [], H2: [], H3: [], H4: [], H5: [], H6: [],
  TABLE: [], THEAD: [], TBODY: [], TR: [], TH: ["align"], TD: ["align"],
  SPAN: ["class"], INPUT: ["type", "checked", "disabled"], SUP: [], SUB: [],
};
// Subtrees dropped whole, text included.
const DROPPED = new Set(["SCRIPT", "STYLE", "TEMPLATE", "IFRAME", "OBJECT", "EMBED", "NOSCRIPT", "SVG", "MATH"]);
const SAFE_URL = /^(https?:|mailto:|#)/i;

function clean(node, into) {
  for (const child of node.childNodes) {
    if (child.nodeType === Node.TEXT_NODE) {
      into.append(document.createTextNode(child.data));
      continue;
    }
    if (child.nodeType !== Node.ELEMENT_NODE || DROPPED.has(child.tagName)) continue;
    const keep = ALLOWED[child.tagName];
    if (!keep) {
      clean(child, into); // unknown tag: keep its text only
      continue;
    }
    const el = document.createElement(child.tagName);
    for (const name of keep) {
      const value = child.getAttribute(name);
      if (value === null) continue;
      if (name === "href" && !SAFE_URL.test(value.trim())) continue;
      if (name === "class" && !/^[\w\- ]*$/.test(value)) continue;
      if (name === "type" && value !== "checkbox") continue;
      el.setAttribute(name, value);
    }
    if (el.tagName === "A") {
      el.rel = "noopener noreferrer nofollow";
      el.target = "_blank";
    }
    if (el.tagName === "INPUT") el.disabled = true;
    clean(child, el);
    into.append(el);
  }
}

/** The sanitised fragment of some HTML (an allow-list copy of its parse). */
export function sanitize(html) {
  const parsed = new DOMParser().parseFromString(`<body>${html}</body>`, "text/html");
  const fragment = document.createDocumentFragment();
  clean(parsed.body, fragment);
  return fragment;
}

/** Highlight the code blocks of ``root`` (``language-x`` classes from fences). */
export function highlight(root) {
  const hljs = globalThis.hljs;
  if (!hljs) return;
  for (const code of root.querySelectorAll("pre > code")) {
    if (code.dataset.highlighted) continue;
    const lang = [...code.classList].find((c) => c.startsWith("language-"))?.slice(9);
    const text = code.textContent;
    const result =
      lang && hljs.getLanguage(lang) ? hljs.highlight(text, { language: lang, ignoreIllegals: true }) : hljs.highlightAuto(text);
    code.replaceChildren(sanitize(result.value)); // hljs escapes; sanitised anyway
    code.classList.add("hljs");
    code.dataset.highlighted = "yes";
    addCopyButton(code.parentElement);
  }
}

function addCopyButton(pre) {
  if (!pre || pre.querySelector(".copy-code")) return;
  const button = document.createElement("button");
  button.type = "button";
  button.className = "copy-code";
  button.textContent = "Copy";
  button.setAttribute("aria-label", "Copy code");
  button.addEventListener("click", async () => {
    try {
      await navigator.clipboard.writeText(pre.querySelector("code").textContent);
      button.textContent = "Copied";
    } catch {
      button.textContent = "Copy failed";
    }
    setTimeout(() => (button.textContent = "Copy"), 1500);
  });
  pre.append(button);
}

/**
 * Render ``text`` (the model's Markdown) into ``el``.
 * @param {HTMLElement} el the target; its children are replaced.
 * @param {string} text Markdown.
 * @param {boolean} withHighlight highlight code blocks (skipped while streaming).
 */
export function renderMarkdown(el, text, withHighlight = true) {
  el.replaceChildren(sanitize(marked.parse(text)));
  if (withHighlight) highlight(el);
}

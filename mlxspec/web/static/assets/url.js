// The open conversation in the URL: #chat/<id> names a stored session, #chat a
// blank chat (the reference's hash route for the chat page), "" a fresh page.
// History entries are pushed when the shown session changes, so back and
// forward move between chats; app.js follows hashchange the other way.

/** The hash of session ``id`` (null: a blank chat). */
export function chatHash(id) {
  return id ? `#chat/${encodeURIComponent(id)}` : "#chat";
}

/** The session id #chat/<id> names, or null. */
export function hashSession() {
  const match = /^#chat\/(.+)$/.exec(location.hash);
  if (!match) return null;
  try {
    return decodeURIComponent(match[1]);
  } catch {
    return match[1];
  }
}

/** Whether the URL shows the chat (not another view such as #status). */
export function onChatRoute() {
  return location.hash === "" || location.hash === "#chat" || location.hash.startsWith("#chat/");
}

/** Name the shown session in the URL: a new history entry when it changed. */
export function syncUrl(id) {
  if (!onChatRoute()) return; // the status view keeps its URL
  if (!id && location.hash === "") return; // a fresh page stays at /
  const want = chatHash(id);
  if (location.hash !== want) window.history.pushState(null, "", want);
}

/** A URL session that is not there: the blank chat takes its entry's place. */
export function showBlankInUrl() {
  window.history.replaceState(null, "", "#chat");
}

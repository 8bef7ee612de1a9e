// The web chat's service worker: installability and an instant paint of the
// shell on the next visit, while the WebSocket connects. Not offline chat: it
// answers only the exact shell files below (cached, refreshed in the
// background); every other request (/v1/*, /ws/chat, /stats, /fit, ...) goes
// to the network untouched.

const CACHE = "mlxspec-shell-v7";
const SHELL = [
  "/",
  "/manifest.webmanifest",
  "/assets/app.js",
  "/assets/messages.js",
  "/assets/attachments.js",
  "/assets/markdown.js",
  "/assets/panels.js",
  "/assets/socket.js",
  "/assets/mic.js",
  "/assets/adapters.js",
  "/assets/url.js",
  "/assets/search.js",
  "/assets/assistant.js",
  "/assets/mic-worklet.js",
  "/assets/marked.esm.js",
  "/assets/app.css",
  "/assets/hljs.js",
  "/assets/hljs.css",
  "/assets/hljs-dark.css",
  "/assets/icon.svg",
];

self.addEventListener("install", (event) => {
  event.waitUntil(caches.open(CACHE).then((cache) => cache.addAll(SHELL)));
  self.skipWaiting();
});

self.addEventListener("activate", (event) => {
  event.waitUntil(
    caches
      .keys()
      .then((keys) => Promise.all(keys.filter((k) => k !== CACHE).map((k) => caches.delete(k))))
      .then(() => self.clients.claim()),
  );
});

self.addEventListener("fetch", (event) => {
  const url = new URL(event.request.url);
  if (event.request.method !== "GET" || url.origin !== self.location.origin) return;
  if (url.search || !SHELL.includes(url.pathname)) return; // the network, untouched
  const fresh = fetch(event.request).then(async (response) => {
    if (response.ok) await (await caches.open(CACHE)).put(event.request, response.clone());
    return response;
  });
  event.waitUntil(fresh.catch(() => undefined));
  event.respondWith(caches.match(event.request).then((hit) => hit || fresh));
});

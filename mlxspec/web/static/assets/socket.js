// The /ws/chat connection: JSON frames both ways, the API key, reconnects.
//
// The frames are the document's ChatSocketClientFrame / ChatSocketServerFrame
// (GET /openapi.json). A keyed server sends auth_required first: the stored key
// (asked once, kept in localStorage) goes back in an auth frame. Close code
// 4401 means the key was wrong: it is forgotten and asked for again.

const KEY_STORE = "mlxspec.apiKey";
export const CLOSE_UNAUTHORIZED = 4401;

export function storedKey() {
  try {
    return localStorage.getItem(KEY_STORE) || "";
  } catch {
    return "";
  }
}

export function storeKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORE, key);
    else localStorage.removeItem(KEY_STORE);
  } catch {
    /* private mode: the key lasts for this page only */
  }
}

/** Headers for the page's own HTTP reads (/v1/models, /fit, /stats). */
export function authHeaders() {
  const key = storedKey();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

export class ChatConnection {
  /**
   * @param {object} hooks onFrame(frame), onState(state: "connecting"|"open"|"closed"),
   *   askKey(message) -> Promise<string> (the user's key).
   */
  constructor(hooks) {
    this.hooks = hooks;
    this.ws = null;
    this.retry = 0;
    this.timer = null;
  }

  get url() {
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    return `${scheme}//${location.host}/ws/chat`;
  }

  connect() {
    clearTimeout(this.timer);
    this.hooks.onState("connecting");
    const ws = new WebSocket(this.url);
    this.ws = ws;
    ws.addEventListener("message", (event) => this.receive(event.data));
    ws.addEventListener("open", () => {
      this.retry = 0;
      this.hooks.onState("open");
    });
    ws.addEventListener("close", (event) => this.closed(ws, event));
  }

  async receive(data) {
    let frame;
    try {
      frame = JSON.parse(data);
    } catch {
      return;
    }
    if (frame.type === "auth_required") {
      let key = storedKey();
      if (!key) {
        key = await this.hooks.askKey("This server needs its API key.");
        storeKey(key);
      }
      this.send({ type: "auth", key });
      return;
    }
    this.hooks.onFrame(frame);
  }

  async closed(ws, event) {
    if (ws !== this.ws) return;
    this.hooks.onState("closed");
    if (event.code === CLOSE_UNAUTHORIZED) {
      storeKey("");
      storeKey(await this.hooks.askKey("That API key was not accepted. Enter the server's key."));
      this.connect();
      return;
    }
    const wait = Math.min(10000, 500 * 2 ** this.retry++);
    this.timer = setTimeout(() => this.connect(), wait);
  }

  /** Send a frame; false when the socket is not open. */
  send(frame) {
    if (!this.ws || this.ws.readyState !== WebSocket.OPEN) return false;
    this.ws.send(JSON.stringify(frame));
    return true;
  }
}

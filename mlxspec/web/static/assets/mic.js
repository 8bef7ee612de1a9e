// The hold-to-talk microphone: getUserMedia -> an AudioWorklet (mic-worklet.js,
// 16 kHz mono float32) -> a dictation session (POST /v1/audio/sessions, its
// .../audio chunks in order, .../finish) -> the transcript in the message box.
//
// Hold the button (pointer or Space/Enter on it) and release to transcribe; a
// quick press (under HOLD_MS) latches it instead, and the next press stops; Esc
// on the button cancels the take (its session is deleted, nothing is typed). The
// chunks are the document's `audio/pcm;rate=16000`: raw little-endian float32,
// sent one at a time (each awaits its receipt, as the route asks). Both the
// microphone and AudioWorklet need a secure page: https, localhost or 127.0.0.1.

import { authHeaders } from "./socket.js";

const HOLD_MS = 400;
const MIN_CHUNK = 4000; // samples (250 ms at 16 kHz): fewer, larger POSTs

/** An HTTP error of the audio routes, with the server's message. */
async function failure(response, what) {
  let message = "";
  try {
    message = (await response.json()).error?.message || "";
  } catch {
    /* not JSON */
  }
  return new Error(`${what} (${response.status})${message ? `: ${message}` : ""}`);
}

function littleEndian(samples) {
  if (new Uint8Array(new Uint16Array([1]).buffer)[0] === 1) return samples.buffer;
  const view = new DataView(new ArrayBuffer(samples.length * 4)); // a big-endian machine
  samples.forEach((x, i) => view.setFloat32(i * 4, x, true));
  return view.buffer;
}

/** One take: the capture graph and its session. */
export class Dictation {
  constructor() {
    this.pending = [];
    this.pendingSamples = 0;
    this.rate = 16000;
    this.sending = null;
    this.error = null;
    // Made at once, inside the press's user activation, so it may start running.
    this.context = typeof AudioContext === "function" ? new AudioContext() : null;
  }

  /** Open the microphone and run the capture graph (the session opens beside it). */
  async capture() {
    if (!navigator.mediaDevices?.getUserMedia || !this.context?.audioWorklet) {
      throw new Error("The microphone needs a secure page: open the chat over https or on localhost.");
    }
    this.opening = this.open();
    this.opening.catch(() => {}); // awaited below; a rejection must not go unhandled meanwhile
    // The chunks wait for the session; the capture does not (the first words count).
    this.sending = this.opening.then((id) => (this.id = id));
    this.sending.catch(() => {}); // start() reports a refused session
    let stream;
    try {
      [stream] = await Promise.all([
        navigator.mediaDevices.getUserMedia({
          audio: { channelCount: 1, echoCancellation: true, noiseSuppression: true },
        }),
        this.context.audioWorklet.addModule("/assets/mic-worklet.js"),
      ]);
    } catch (e) {
      this.opening.then((id) => this.discard(id), () => {});
      throw new Error(
        e.name === "NotAllowedError"
          ? "Microphone permission was denied: allow it for this site to dictate."
          : `No microphone: ${e.message || e.name}`,
      );
    }
    this.stream = stream;
    if (this.cancelled) {
      this.release(); // cancelled while the microphone opened
      throw this.error;
    }
    this.node = new AudioWorkletNode(this.context, "mlxspec-mic");
    this.node.port.onmessage = (event) => this.received(event.data);
    this.source = this.context.createMediaStreamSource(stream);
    this.source.connect(this.node);
    this.node.connect(this.context.destination); // silent: the node writes no output
    await this.context.resume();
  }

  /**
   * Open the microphone and the session together; resolves once both are open. The
   * capture runs as soon as the microphone is open (`this.capturing`), while the session
   * may still be opening (the first one loads the Whisper weights: seconds).
   */
  async start() {
    this.capturing = this.capture();
    await this.capturing;
    await this.opening; // a refused session (no transcriber, a 4xx) ends the take here
  }

  /**
   * End the capture now: the worklet's last samples are taken and the microphone let go.
   * A release ends the take at the release, even while the session is still opening.
   */
  stopCapture() {
    if (!this.stopped) {
      this.stopped = (async () => {
        if (this.node) {
          const flushed = new Promise((resolve) => (this.onFlushed = resolve));
          this.node.port.postMessage("flush");
          await flushed;
        }
        this.release();
      })();
    }
    return this.stopped;
  }

  async open() {
    const r = await fetch("/v1/audio/sessions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: "{}",
    });
    if (!r.ok) throw await failure(r, "Transcription is unavailable");
    return (await r.json()).id;
  }

  received(data) {
    if (data.samples) {
      this.rate = data.rate;
      this.pending.push(data.samples);
      this.pendingSamples += data.samples.length;
      if (this.pendingSamples >= MIN_CHUNK) this.send();
    } else if (data.flushed) {
      this.onFlushed?.();
    }
  }

  /** Queue the pending samples as the next chunk (chunks go one at a time). */
  send() {
    if (!this.pendingSamples) return this.sending;
    const chunk = new Float32Array(this.pendingSamples);
    let at = 0;
    for (const part of this.pending) {
      chunk.set(part, at);
      at += part.length;
    }
    this.pending = [];
    this.pendingSamples = 0;
    const rate = this.rate;
    this.sending = this.sending.then(async () => {
      if (this.error) return;
      const r = await fetch(`/v1/audio/sessions/${this.id}/audio`, {
        method: "POST",
        headers: { "Content-Type": `audio/pcm;rate=${rate}`, ...authHeaders() },
        body: littleEndian(chunk),
      });
      if (!r.ok) this.error = await failure(r, "The audio was refused");
    });
    this.sending.catch((e) => (this.error ||= e));
    return this.sending;
  }

  /** Stop the capture, send the rest, and answer the transcript. */
  async finish() {
    await this.stopCapture();
    await this.send().catch(() => {});
    if (this.error) {
      await this.discard(this.id);
      throw this.error;
    }
    const r = await fetch(`/v1/audio/sessions/${this.id}/finish`, {
      method: "POST",
      headers: authHeaders(),
    });
    if (!r.ok) throw await failure(r, "The transcription failed");
    return ((await r.json()).text || "").trim();
  }

  /** Drop the take: no more chunks, no transcript, the session discarded. */
  async cancel() {
    this.cancelled = true;
    this.error ||= new Error("cancelled");
    this.release();
    await this.sending?.catch(() => {});
    await this.discard(this.id);
  }

  /** Let go of the microphone and the audio graph. */
  release() {
    this.source?.disconnect();
    this.node?.disconnect();
    this.stream?.getTracks().forEach((track) => track.stop());
    if (this.context && this.context.state !== "closed") this.context.close().catch(() => {});
  }

  async discard(id) {
    if (!id) return;
    await fetch(`/v1/audio/sessions/${id}`, { method: "DELETE", headers: authHeaders() }).catch(() => {});
  }
}

/**
 * The button's states: idle -> recording (held, or latched by a quick press)
 * -> transcribing -> idle.
 *
 * @param {HTMLButtonElement} button
 * @param {object} hooks insert(text), notice(text) (an inline error or "").
 */
export function wireMic(button, hooks) {
  let take = null;
  let pressedAt = 0;
  let latched = false;

  function show(state) {
    button.dataset.state = state;
    button.setAttribute("aria-pressed", String(state === "recording"));
    button.title = {
      idle: "Hold to talk (or press Space to start and again to stop)",
      recording: latched
        ? "Listening: press again to stop, Esc to cancel"
        : "Listening: release to transcribe, Esc to cancel",
      transcribing: "Transcribing…",
    }[state];
  }

  async function press() {
    if (button.dataset.state === "transcribing") return;
    if (take) {
      if (latched) release(true);
      return;
    }
    hooks.notice("");
    latched = false;
    pressedAt = performance.now();
    const current = (take = new Dictation());
    show("recording");
    current.starting = current.start();
    try {
      await current.starting;
    } catch (e) {
      current.release();
      if (current.cancelled) return;
      if (take === current) take = null;
      show("idle");
      hooks.notice(e.message);
    }
  }

  async function release(force = false) {
    if (!take || button.dataset.state !== "recording") return;
    if (!force && !latched && performance.now() - pressedAt < HOLD_MS) {
      latched = true; // a tap: keep listening until the next press
      show("recording");
      return;
    }
    const current = take;
    show("transcribing");
    try {
      await current.capturing; // released while the microphone was still opening
      current.stopCapture(); // the take ends at the release, not once the session is open
      await current.starting; // the session may still be opening (the first loads Whisper)
    } catch {
      return; // press() shows why
    }
    try {
      const text = await current.finish();
      if (text) hooks.insert(text);
      else hooks.notice("No speech was heard.");
    } catch (e) {
      current.release();
      hooks.notice(e.message);
    } finally {
      take = null;
      latched = false;
      show("idle");
    }
  }

  button.addEventListener("pointerdown", (event) => {
    if (event.button !== 0) return;
    event.preventDefault(); // keep the caret in the message box
    button.setPointerCapture(event.pointerId);
    press();
  });
  button.addEventListener("pointerup", () => release());
  button.addEventListener("pointercancel", () => release(true));
  button.addEventListener("contextmenu", (event) => event.preventDefault()); // a long touch
  function cancel() {
    if (!take || button.dataset.state !== "recording") return;
    const current = take;
    take = null;
    latched = false;
    show("idle");
    current.cancel();
  }

  button.addEventListener("keydown", (event) => {
    if (event.key === "Escape") {
      event.preventDefault();
      cancel();
    } else if ((event.key === " " || event.key === "Enter") && !event.repeat) {
      event.preventDefault();
      press();
    }
  });
  button.addEventListener("keyup", (event) => {
    if (event.key === " " || event.key === "Enter") {
      event.preventDefault();
      release();
    }
  });
  show("idle");
}

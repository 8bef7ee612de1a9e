// The microphone's audio-thread half: mono, 16 kHz float32 blocks to the page.
//
// Runs in the AudioWorkletGlobalScope (`sampleRate` is the context's rate,
// usually the device's 44.1 or 48 kHz). Each output sample is the mean of the
// ~rate/16000 input samples it stands for: a box filter, so content above 8 kHz
// is damped rather than folded into the speech band (Whisper hears 0-8 kHz).
// Blocks of 100 ms go to the page; "flush" sends what is left, then "flushed".

const TARGET_RATE = 16000;
const BLOCK = 1600; // 100 ms at 16 kHz

class MicCapture extends AudioWorkletProcessor {
  constructor() {
    super();
    // A context slower than 16 kHz is sent as it is (the server resamples).
    this.rate = sampleRate >= TARGET_RATE ? TARGET_RATE : sampleRate;
    this.step = sampleRate / this.rate; // input samples per output sample
    this.sum = 0;
    this.count = 0;
    this.position = 0;
    this.out = new Float32Array(BLOCK);
    this.filled = 0;
    this.port.onmessage = (event) => {
      if (event.data === "flush") {
        this.post();
        this.port.postMessage({ flushed: true });
      }
    };
  }

  post() {
    if (!this.filled) return;
    const samples = this.out.slice(0, this.filled);
    this.port.postMessage({ samples, rate: this.rate }, [samples.buffer]);
    this.filled = 0;
  }

  process(inputs) {
    const channels = inputs[0];
    if (!channels || !channels.length) return true;
    const frames = channels[0].length;
    for (let i = 0; i < frames; i++) {
      let x = 0;
      for (const channel of channels) x += channel[i];
      this.sum += x / channels.length;
      this.count += 1;
      this.position += 1;
      if (this.position >= this.step) {
        this.position -= this.step;
        this.out[this.filled++] = this.sum / this.count;
        this.sum = 0;
        this.count = 0;
        if (this.filled === BLOCK) this.post();
      }
    }
    return true;
  }
}

registerProcessor("mlxspec-mic", MicCapture);

"""Tests for mlxspec.engine.model.gguf: GGUF -> MLX model folder conversion, on
tiny GGUFs written here (the embedded model's file: ``tests/real/test_gguf.py``)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import mlx.core as mx  # noqa: E402
import mlx_lm  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

from mlxspec.engine.model.gguf import GGUFError, convert_gguf  # noqa: E402

ROUND_TRIP_TEXTS = [
    "Héllo wörld 12345 😀",
    "  two  spaces, tabs\tand\nnew lines\n\n",
    "don't 3.14159 — ünïcödé 日本語 <b>tags</b>",
]


# --- a tiny llama written here ------------------------------------------------------------

HIDDEN, LAYERS, HEADS, KV_HEADS, FFN = 64, 2, 4, 2, 128
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "1 2"]


def _byte_chars() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (openai/gpt-2 encoder.py)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def tiny_metadata(**overrides: Any) -> dict[str, Any]:
    """Metadata of a tiny llama with a byte-level BPE vocabulary (plain Python values)."""
    tokens = CONTROL + _byte_chars() + [m.replace(" ", "") for m in MERGES]
    meta: dict[str, Any] = {
        "general.architecture": "llama",
        "llama.embedding_length": HIDDEN,
        "llama.block_count": LAYERS,
        "llama.feed_forward_length": FFN,
        "llama.attention.head_count": HEADS,
        "llama.attention.head_count_kv": KV_HEADS,
        "llama.attention.layer_norm_rms_epsilon": 1e-6,
        "llama.rope.freq_base": 10000.0,
        "llama.context_length": 256,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [3] * len(CONTROL) + [1] * (len(tokens) - len(CONTROL)),
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    }
    meta.update(overrides)
    return {k: v for k, v in meta.items() if v is not None}


def tiny_weights(untied: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """Random float32 weights in GGUF naming, (out, in) like mx.load returns them."""
    rng = np.random.default_rng(seed)
    vocab = len(tiny_metadata()["tokenizer.ggml.tokens"])
    kv = HIDDEN // HEADS * KV_HEADS
    shapes = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (kv, HIDDEN), "attn_v": (kv, HIDDEN)}
    shapes |= {"attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN)}
    shapes |= {"ffn_up": (FFN, HIDDEN), "ffn_down": (HIDDEN, FFN)}
    weights = {"token_embd.weight": rng.normal(0, 0.5, (vocab, HIDDEN))}
    weights["output_norm.weight"] = np.ones(HIDDEN)
    if untied:
        weights["output.weight"] = rng.normal(0, 0.1, (vocab, HIDDEN))
    for layer in range(LAYERS):
        for name, shape in shapes.items():
            weights[f"blk.{layer}.{name}.weight"] = rng.normal(0, 0.1, shape)
        weights[f"blk.{layer}.attn_norm.weight"] = 1 + rng.normal(0, 0.1, HIDDEN)
        weights[f"blk.{layer}.ffn_norm.weight"] = 1 + rng.normal(0, 0.1, HIDDEN)
    return {k: v.astype(np.float32) for k, v in weights.items()}


def _mx_metadata(meta: dict[str, Any]) -> dict[str, Any]:
    """Convert plain metadata values to what mx.save_gguf takes."""
    out: dict[str, Any] = {}
    for key, value in meta.items():
        if isinstance(value, bool):
            out[key] = mx.array(value)
        elif isinstance(value, int):
            out[key] = mx.array(value, dtype=mx.uint32)
        elif isinstance(value, float):
            out[key] = mx.array(value, dtype=mx.float32)
        elif isinstance(value, list) and value and isinstance(value[0], int):
            out[key] = mx.array(value, dtype=mx.int32)
        else:
            out[key] = value
    return out


def save_float_gguf(path: Path, weights: dict[str, np.ndarray], meta: dict[str, Any], dtype):
    """Write F32/F16 tensors (1-D norms stay F32, as llama.cpp writes them)."""
    arrays = {
        k: mx.array(v).astype(dtype if v.ndim == 2 else mx.float32) for k, v in weights.items()
    }
    mx.save_gguf(str(path), arrays, _mx_metadata(meta))
    return path


@pytest.mark.parametrize("dtype", [mx.float32, mx.float16], ids=["F32", "F16"])
@pytest.mark.parametrize("untied", [False, True], ids=["tied", "untied"])
def test_float_gguf_loads(tmp_path: Path, dtype, untied: bool) -> None:
    weights = tiny_weights(untied=untied)
    gguf = save_float_gguf(tmp_path / "tiny.gguf", weights, tiny_metadata(), dtype)
    out = convert_gguf(gguf, tmp_path / "out")
    config = json.loads((out / "config.json").read_text())
    assert "quantization" not in config
    assert config["tie_word_embeddings"] is (not untied)
    assert config["vocab_size"] == len(tiny_metadata()["tokenizer.ggml.tokens"])
    model, tokenizer = mlx_lm.load(str(out))
    q_proj = model.model.layers[1].self_attn.q_proj.weight
    expected = mx.array(weights["blk.1.attn_q.weight"]).astype(dtype)
    assert mx.array_equal(q_proj, expected)
    logits = model(mx.array([tokenizer.encode("the 12")]))
    assert logits.shape[-1] == config["vocab_size"]
    assert mx.all(mx.isfinite(logits)).item()
    text = mlx_lm.generate(model, tokenizer, "the", max_tokens=3)
    assert isinstance(text, str)


def test_a_conversion_says_so_in_one_line_off_a_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from mlxspec.engine.model.gguf_cache import convert_once

    gguf = save_float_gguf(tmp_path / "tiny.gguf", tiny_weights(), tiny_metadata(), mx.float32)
    out = convert_once(gguf, tmp_path / "cache")
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        f"mlxspec: hashing tiny.gguf ({gguf.stat().st_size >> 20} MiB)",
        f"mlxspec: converting tiny.gguf once into {out}",
    ]
    assert convert_once(gguf, tmp_path / "cache") == out
    assert capsys.readouterr().err == ""  # the second start finds it: nothing to say


def test_tiny_tokenizer(tmp_path: Path) -> None:
    gguf = save_float_gguf(tmp_path / "t.gguf", tiny_weights(), tiny_metadata(), mx.float32)
    tokenizer = AutoTokenizer.from_pretrained(convert_gguf(gguf, tmp_path / "out"))
    for text in ROUND_TRIP_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    ids = tokenizer.encode(" the<|im_end|>", add_special_tokens=False)
    assert ids == [len(CONTROL) + 256 + 2, 2]
    assert tokenizer.decode(ids, skip_special_tokens=True) == " the"
    assert tokenizer.chat_template.startswith("{% for m in messages %}")


@pytest.mark.parametrize("pre", ["gpt2", "smollm", "llama-bpe", "qwen2", "default", "weird"])
def test_pre_tokenizers_round_trip(tmp_path: Path, pre: str) -> None:
    meta = tiny_metadata(**{"tokenizer.ggml.pre": pre})
    gguf = save_float_gguf(tmp_path / "t.gguf", tiny_weights(), meta, mx.float32)
    tokenizer = AutoTokenizer.from_pretrained(convert_gguf(gguf, tmp_path / "out"))
    for text in ROUND_TRIP_TEXTS:
        assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    # smollm and qwen2 split digits one by one; the others keep "12" whole (llama-vocab.cpp).
    digit_ids = tokenizer.encode("12", add_special_tokens=False)
    merged = len(CONTROL) + 256 + 3  # the "1 2" merge
    assert digit_ids == ([merged] if pre not in {"smollm", "qwen2"} else digit_ids[:2])
    assert len(digit_ids) == (2 if pre in {"smollm", "qwen2"} else 1)


def test_add_bos_token(tmp_path: Path) -> None:
    meta = tiny_metadata(**{"tokenizer.ggml.add_bos_token": True})
    gguf = save_float_gguf(tmp_path / "t.gguf", tiny_weights(), meta, mx.float32)
    out = convert_gguf(gguf, tmp_path / "out")
    _, tokenizer = mlx_lm.load(str(out))
    ids = tokenizer.encode("the")
    assert ids[0] == 1 and ids.count(1) == 1
    assert tokenizer.encode("the", add_special_tokens=False)[0] != 1


# --- quantized tensors, written with a minimal GGUF writer ---------------------------------

# ggml type ids and block layouts (ggml docs/gguf.md, ggml-common.h).
GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8}


def quantize(w: np.ndarray, kind: str) -> tuple[bytes, np.ndarray]:
    """Quantize rows of ``w`` to GGUF blocks of 32; return the bytes and their value."""
    blocks = w.reshape(-1, 32).astype(np.float32)
    if kind == "Q8_0":
        d = (np.abs(blocks).max(1, keepdims=True) / 127).astype(np.float16)
        q = np.round(blocks / d.astype(np.float32)).astype(np.int8)
        rec = np.zeros(len(blocks), dtype=[("d", "<f2"), ("q", "i1", 32)])
        rec["d"], rec["q"] = d[:, 0], q
        return rec.tobytes(), (d.astype(np.float32) * q).reshape(w.shape)
    low = blocks.min(1, keepdims=True) if kind == "Q4_1" else None
    if kind == "Q4_1":
        d = ((blocks.max(1, keepdims=True) - low) / 15).astype(np.float16)
        m = low.astype(np.float16)
    else:  # Q4_0: value = d * (q - 8)
        d = (np.abs(blocks).max(1, keepdims=True) / 7).astype(np.float16)
        m = (-8 * d.astype(np.float32)).astype(np.float32)
    q = np.clip(np.round((blocks - m.astype(np.float32)) / d.astype(np.float32)), 0, 15)
    q = q.astype(np.uint8)
    fields = [("d", "<f2")] + ([("m", "<f2")] if kind == "Q4_1" else []) + [("qs", "u1", 16)]
    rec = np.zeros(len(blocks), dtype=fields)
    rec["d"], rec["qs"] = d[:, 0], q[:, :16] | (q[:, 16:] << 4)
    if kind == "Q4_1":
        rec["m"] = m[:, 0]
    value = d.astype(np.float32) * q + m.astype(np.float32)
    return rec.tobytes(), value.reshape(w.shape)


def _gguf_string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _gguf_value(value: Any) -> bytes:
    """Type id + payload of one GGUF metadata value (GGUF spec v3)."""
    if isinstance(value, bool):
        return struct.pack("<I?", 7, value)
    if isinstance(value, int):
        return struct.pack("<II", 4, value)
    if isinstance(value, float):
        return struct.pack("<If", 6, value)
    if isinstance(value, str):
        return struct.pack("<I", 8) + _gguf_string(value)
    if value and isinstance(value[0], str):
        return struct.pack("<IIQ", 9, 8, len(value)) + b"".join(map(_gguf_string, value))
    return struct.pack("<IIQ", 9, 5, len(value)) + np.asarray(value, "<i4").tobytes()


def write_gguf(path: Path, meta: dict[str, Any], tensors: dict[str, tuple[str, Any]]) -> Path:
    """Write a GGUF v3 file; ``tensors`` maps names to (ggml type, bytes, numpy shape)."""
    header = struct.pack("<4sIQQ", b"GGUF", 3, len(tensors), len(meta))
    header += b"".join(_gguf_string(k) + _gguf_value(v) for k, v in meta.items())
    infos, data = b"", b""
    for name, (kind, payload, shape) in tensors.items():
        dims = shape[::-1]  # ggml ne[0] is the innermost dimension
        infos += _gguf_string(name) + struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
        infos += struct.pack("<IQ", GGML_TYPES[kind], len(data))
        data += payload + b"\0" * (-len(payload) % 32)
    head = header + infos
    path.write_bytes(head + b"\0" * (-len(head) % 32) + data)
    return path


def test_mixed_quantized_gguf(tmp_path: Path) -> None:
    weights = tiny_weights(untied=True)
    kinds = {"token_embd.weight": "Q8_0", "output.weight": "F16", "blk.0.ffn_down.weight": "Q8_0"}
    tensors, expected = {}, {}
    for name, w in weights.items():
        kind = kinds.get(name, "Q4_1" if w.ndim == 2 else "F32")
        kind = "Q4_0" if name.startswith("blk.1.attn") and w.ndim == 2 else kind
        if kind.startswith("Q"):
            payload, expected[name] = quantize(w, kind)
        else:
            arr = w.astype(np.float16 if kind == "F16" else np.float32)
            payload, expected[name] = arr.tobytes(), arr.astype(np.float32)
        tensors[name] = (kind, payload, w.shape)
    out = convert_gguf(write_gguf(tmp_path / "q.gguf", tiny_metadata(), tensors), tmp_path / "o")
    quant = json.loads((out / "config.json").read_text())["quantization"]
    assert (quant["bits"], quant["group_size"]) == (4, 32)
    assert quant["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    assert quant["model.layers.0.mlp.down_proj"] == {"group_size": 32, "bits": 8}
    assert quant["lm_head"] is False
    model, tokenizer = mlx_lm.load(str(out))
    layer = model.model.layers[1]
    for name, module in [
        ("blk.1.attn_q.weight", layer.self_attn.q_proj),
        ("blk.1.ffn_up.weight", layer.mlp.up_proj),
        ("blk.0.ffn_down.weight", model.model.layers[0].mlp.down_proj),
        ("token_embd.weight", model.model.embed_tokens),
    ]:
        got = mx.dequantize(module.weight, module.scales, module.biases, 32, module.bits)
        np.testing.assert_allclose(
            np.array(got.astype(mx.float32)), expected[name], rtol=2e-3, atol=1e-3
        )
    assert mx.all(mx.isfinite(model(mx.array([tokenizer.encode("the")])))).item()


# --- rejected inputs -----------------------------------------------------------------------


def test_rejects_non_llama(tmp_path: Path) -> None:
    gguf = tmp_path / "bert.gguf"
    mx.save_gguf(str(gguf), {"x.weight": mx.ones((4, 4))}, {"general.architecture": "bert"})
    with pytest.raises(GGUFError, match="unsupported GGUF architecture 'bert'"):
        convert_gguf(gguf, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_rejects_sentencepiece_tokenizer(tmp_path: Path) -> None:
    meta = tiny_metadata(**{"tokenizer.ggml.model": "llama"})
    gguf = save_float_gguf(tmp_path / "t.gguf", tiny_weights(), meta, mx.float32)
    with pytest.raises(GGUFError, match="tokenizer model 'llama'"):
        convert_gguf(gguf, tmp_path / "out")


def test_rejects_unknown_tensors(tmp_path: Path) -> None:
    weights = tiny_weights() | {"blk.0.ffn_gate_exps.weight": np.ones((4, 64), np.float32)}
    gguf = save_float_gguf(tmp_path / "t.gguf", weights, tiny_metadata(), mx.float32)
    with pytest.raises(GGUFError, match="blk.0.ffn_gate_exps.weight"):
        convert_gguf(gguf, tmp_path / "out")


def test_rejects_missing_metadata(tmp_path: Path) -> None:
    meta = tiny_metadata(**{"llama.block_count": None})
    gguf = save_float_gguf(tmp_path / "t.gguf", tiny_weights(), meta, mx.float32)
    with pytest.raises(GGUFError, match="llama.block_count"):
        convert_gguf(gguf, tmp_path / "out")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"llama.attention.head_count_kv": [2, 2]}, "per-layer"),
        ({"llama.rope.scaling.type": "yarn"}, "rope scaling type 'yarn'"),
        ({"llama.rope.dimension_count": 8}, "partial rotary"),
    ],
    ids=["per-layer-heads", "yarn", "partial-rope"],
)
def test_rejects_unsupported_metadata(tmp_path: Path, overrides: dict, message: str) -> None:
    gguf = save_float_gguf(
        tmp_path / "t.gguf", tiny_weights(), tiny_metadata(**overrides), mx.float32
    )
    with pytest.raises(GGUFError, match=message):
        convert_gguf(gguf, tmp_path / "out")


def test_linear_rope_scaling_and_dropped_rope_freqs(tmp_path: Path) -> None:
    meta = tiny_metadata(**{"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 2.0})
    weights = tiny_weights() | {"rope_freqs.weight": np.ones(8, np.float32)}
    out = convert_gguf(
        save_float_gguf(tmp_path / "t.gguf", weights, meta, mx.float32), tmp_path / "o"
    )
    config = json.loads((out / "config.json").read_text())
    assert config["rope_scaling"] == {"type": "linear", "factor": 2.0}
    model, _ = mlx_lm.load(str(out))  # strict: rope_freqs is not in the safetensors
    assert model.model.layers[0].self_attn.rope is not None


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="not found"):
        convert_gguf(tmp_path / "nope.gguf", tmp_path / "out")


def test_out_dir_holding_something_else(tmp_path: Path) -> None:
    gguf = save_float_gguf(tmp_path / "t.gguf", tiny_weights(), tiny_metadata(), mx.float32)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(GGUFError, match="not a conversion"):
        convert_gguf(gguf, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "t.gguf"]

"""Convert a llama-family GGUF file into an MLX model folder.

The folder holds what ``mlx_lm.load`` reads: ``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json`` and
``generation_config.json``. Tensors come from ``mx.load``, which returns GGUF
Q4_0, Q4_1 and Q8_0 tensors as MLX affine ``weight``/``scales``/``biases``
triples with group size 32 and dequantizes every other quantized type to
float16 (mlx ``mlx/io/gguf.cpp``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from mlxspec.engine.model.progress import progress

__all__ = ["CONVERTER_VERSION", "GGUFError", "MARKER_FILE", "convert_gguf"]

logger = logging.getLogger("mlxspec.engine")

#: Bumped whenever the output of `convert_gguf` changes, so caches keyed on it refresh.
CONVERTER_VERSION = 1
#: Written last into a finished conversion folder.
MARKER_FILE = "mlxspec-gguf.json"

# GGUF spec (ggml docs/gguf.md, "LLaMA" section): the only architecture converted.
_ARCHITECTURES = frozenset({"llama"})
# mx.load packs GGUF Q4_0/Q4_1/Q8_0 blocks of 32 weights (mlx mlx/io/gguf_quants.cpp).
_GGUF_GROUP_SIZE = 32
# GGUF tensor names (llama.cpp gguf-py/gguf/constants.py) -> mlx-lm llama.py module paths.
_GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
# Llama 3.1 rope frequency factors (llama.cpp); mlx-lm llama.py has no such tensor.
_DROPPED = frozenset({"rope_freqs"})
_TENSOR_RE = re.compile(r"^(?:blk\.(\d+)\.)?(\w+)\.(weight|scales|biases)$")
_MISSING = object()

# Pre-tokenizer regexes by `tokenizer.ggml.pre` name (llama.cpp src/llama-vocab.cpp,
# the original tokenizer.json patterns it cites).
_GPT2_NAMES = frozenset({"gpt2", "mpt", "olmo", "jais"})
_DIGIT_NAMES = frozenset(
    {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
)
_LLAMA3_NAMES = frozenset({"llama3", "llama-v3", "llama-bpe", "dbrx", "smaug-bpe"})
_QWEN2_NAMES = frozenset({"qwen2", "stablelm2"})
_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}%s"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# GGUF spec, tokenizer.ggml.token_type (llama.cpp llama_token_type).
_CONTROL, _USER_DEFINED = 3, 4
_ADDED_TYPES = (_CONTROL, _USER_DEFINED)


class GGUFError(ValueError):
    """A GGUF file that cannot be converted: unreadable, corrupt or unsupported."""


def convert_gguf(gguf_path: Path, out_dir: Path, source_sha256: str | None = None) -> Path:
    """Convert a llama-family GGUF file into an MLX model folder, once.

    The folder is built in a temporary folder next to ``out_dir`` and renamed into
    place, so ``out_dir`` either does not exist or holds a finished conversion.
    Tensors keep the dtypes ``mx.load`` gives: float32 norms make activations
    float32, which on MLX CPU decodes about 30x faster than all-float16 (measured
    on SmolLM2-135M Q4_1: 5.3 vs 0.17 tokens/s). Q/K rows stay in GGUF's
    interleaved rope order, hence ``rope_traditional: true``.

    Args:
        gguf_path (Path): The GGUF file (GGUF spec v2 or v3).
        out_dir (Path): The folder to create. If it already holds a finished
            conversion (its marker file or ``config.json``), it is returned as is.
        source_sha256 (str | None): the file's content sha256, recorded in the
            marker file (``mlxspec.engine.model.gguf_cache`` keys folders by it).
            Default: ``None`` (not recorded).

    Returns:
        Path: ``out_dir``, readable by ``mlx_lm.load``.

    Raises:
        GGUFError: If the file is unreadable, corrupt, not a llama-family model,
            has a non-BPE tokenizer, or ``out_dir`` holds something else.
        OSError: If writing the folder fails (e.g. disk full).
    """
    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    if _is_converted(out_dir):
        return out_dir
    what = f"converting {gguf_path.name} once into {out_dir}"
    with progress(what, CONVERSION_STEPS, unit="step") as advance:
        _convert(gguf_path, out_dir, source_sha256, advance)
    return out_dir


#: The steps of a conversion a progress bar counts: read, tokenizer, weights, configs.
CONVERSION_STEPS = 4


def _convert(
    gguf_path: Path, out_dir: Path, source_sha256: str | None, advance: Callable[[int], None]
) -> None:
    weights, meta = _read_gguf(gguf_path)
    tensors = _rename_tensors(weights)
    config = _model_config(meta, tensors)
    advance(1)
    try:
        tokenizer = _build_tokenizer(meta)
    except Exception as e:  # tokenizers raises plain Exception on a bad vocabulary
        raise GGUFError(f"cannot build the tokenizer from {gguf_path.name}: {e}") from e
    advance(1)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), tensors, metadata={"format": "mlx"})
        advance(1)
        _write_json(tmp / "config.json", config)
        tokenizer.save(str(tmp / "tokenizer.json"))
        _write_tokenizer_configs(tmp, meta)
        _write_json(tmp / "generation_config.json", _generation_config(meta))
        source = {"gguf": str(gguf_path.resolve()), "converter_version": CONVERTER_VERSION}
        source |= {"size": gguf_path.stat().st_size}
        if source_sha256 is not None:
            source["sha256"] = source_sha256
        _write_json(tmp / MARKER_FILE, source)
        _publish(tmp, out_dir)
        advance(1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _is_converted(folder: Path) -> bool:
    return (folder / MARKER_FILE).is_file() or (folder / "config.json").is_file()


def _publish(tmp: Path, out_dir: Path) -> None:
    """Rename ``tmp`` to ``out_dir``; a concurrent finished conversion wins."""
    try:
        os.replace(tmp, out_dir)
    except OSError as e:
        if _is_converted(out_dir):
            return
        raise GGUFError(f"cannot create {out_dir}: it exists and is not a conversion") from e


def _read_gguf(path: Path) -> tuple[dict[str, mx.array], dict[str, Any]]:
    """Read tensors and metadata, checking the architecture and tokenizer model.

    Raises:
        GGUFError: If ``mx.load`` fails or the model is not llama with a gpt2 BPE
            tokenizer (GGUF spec: ``general.architecture``, ``tokenizer.ggml.model``).
    """
    if not path.is_file():
        raise GGUFError(f"GGUF file not found: {path}")
    try:
        loaded = mx.load(str(path), format="gguf", return_metadata=True)
    except (RuntimeError, ValueError, OSError) as e:
        raise GGUFError(f"cannot read GGUF file {path}: {e}") from e
    # mx.load's stub has one return type for every format; with metadata it is this pair.
    weights, meta = cast(tuple[dict[str, mx.array], dict[str, Any]], loaded)
    arch = _meta(meta, "general.architecture", None)
    if arch not in _ARCHITECTURES:
        raise GGUFError(
            f"unsupported GGUF architecture {arch!r} in {path.name}: "
            f"only llama-family models ({', '.join(sorted(_ARCHITECTURES))}) are supported"
        )
    tok_model = _meta(meta, "tokenizer.ggml.model", None)
    if tok_model != "gpt2":
        raise GGUFError(
            f"unsupported GGUF tokenizer model {tok_model!r} in {path.name}: "
            "only byte-level BPE ('gpt2') tokenizers are supported"
        )
    return weights, meta


def _meta(meta: dict[str, Any], key: str, default: Any = _MISSING) -> Any:
    """Return a metadata value as a plain Python value (mx.array -> int/float/list)."""
    if key not in meta:
        if default is _MISSING:
            raise GGUFError(f"GGUF metadata lacks required key {key!r}")
        return default
    value = meta[key]
    if isinstance(value, mx.array):
        return value.item() if value.ndim == 0 else value.tolist()
    return value


def _rename_tensors(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """Map GGUF tensor names to mlx-lm llama names, keeping the Q/K row layout.

    GGUF Q/K rows are in the interleaved rope order (llama.cpp convert_hf_to_gguf.py
    ``LlamaModel.permute``), which ``rope_traditional: true`` reads as is.

    Raises:
        GGUFError: On a tensor with no llama equivalent (e.g. MoE experts, biases).
    """
    out: dict[str, mx.array] = {}
    unknown = []
    for name, array in weights.items():
        match = _TENSOR_RE.match(name)
        base = match.group(2) if match else name
        if base in _DROPPED and match and match.group(1) is None:
            logger.warning("dropping GGUF tensor %s: llama3 rope scaling is not applied", name)
            continue
        table = _BLOCK_NAMES if match and match.group(1) is not None else _GLOBAL_NAMES
        if not match or base not in table:
            unknown.append(name)
            continue
        prefix = f"model.layers.{match.group(1)}." if match.group(1) is not None else ""
        out[f"{prefix}{table[base]}.{match.group(3)}"] = array
    if unknown:
        shown = ", ".join(sorted(unknown)[:5])
        raise GGUFError(f"GGUF tensors with no llama equivalent: {shown}")
    if "model.embed_tokens.weight" not in out:
        raise GGUFError("GGUF file has no token_embd.weight tensor")
    return out


def _quantization(tensors: dict[str, mx.array]) -> dict[str, Any] | None:
    """Build mlx-lm's ``quantization`` config, with per-module overrides.

    The default is the most common (group size, bits) pair; modules packed
    differently get their own entry and dense 2-D weights get ``False``
    (mlx-lm utils.py ``load_model`` class_predicate reads both).

    Returns:
        dict | None: ``None`` if no tensor is quantized.
    """
    params: dict[str, dict[str, int] | bool] = {}
    for name, array in tensors.items():
        module = name.rsplit(".", 1)[0]
        if name.endswith(".scales"):
            in_dims = array.shape[-1] * _GGUF_GROUP_SIZE
            bits = tensors[f"{module}.weight"].shape[-1] * 32 // in_dims
            params[module] = {"group_size": _GGUF_GROUP_SIZE, "bits": bits}
        elif name.endswith(".weight") and array.ndim == 2 and f"{module}.scales" not in tensors:
            params[module] = False
    packed = [(p["group_size"], p["bits"]) for p in params.values() if isinstance(p, dict)]
    if not packed:
        return None
    group_size, bits = Counter(packed).most_common(1)[0][0]
    default = {"group_size": group_size, "bits": bits}
    overrides = {module: p for module, p in sorted(params.items()) if p != default}
    return {**default, **overrides}


def _model_config(meta: dict[str, Any], tensors: dict[str, mx.array]) -> dict[str, Any]:
    """Build mlx-lm llama ``config.json`` from ``llama.*`` metadata (GGUF spec, LLaMA)."""
    arch = _meta(meta, "general.architecture")
    hidden = _meta(meta, f"{arch}.embedding_length")
    heads = _meta(meta, f"{arch}.attention.head_count")
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": _meta(meta, f"{arch}.block_count"),
        "intermediate_size": _meta(meta, f"{arch}.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": _meta(meta, f"{arch}.attention.head_count_kv", heads),
        "rms_norm_eps": float(f"{_meta(meta, f'{arch}.attention.layer_norm_rms_epsilon'):.6g}"),
        "vocab_size": tensors["model.embed_tokens.weight"].shape[0],
        "max_position_embeddings": _meta(meta, f"{arch}.context_length"),
        "tie_word_embeddings": "lm_head.weight" not in tensors,
    }
    sizes = {k: v for k, v in config.items() if k.startswith(("num_", "hidden", "inter"))}
    if not all(isinstance(v, int) and v > 0 for v in sizes.values()):
        raise GGUFError(f"unsupported GGUF llama sizes (per-layer values?): {sizes}")
    head_dim = _meta(meta, f"{arch}.attention.key_length", hidden // heads)
    if head_dim != hidden // heads:
        config["head_dim"] = head_dim
    config.update(_rope_config(meta, arch, head_dim))
    for key in ("bos_token_id", "eos_token_id"):
        if (value := _meta(meta, f"tokenizer.ggml.{key}", None)) is not None:
            config[key] = value
    if (quantization := _quantization(tensors)) is not None:
        config["quantization"] = quantization
    return config


def _rope_config(meta: dict[str, Any], arch: str, head_dim: int) -> dict[str, Any]:
    """Return rope settings; GGUF Q/K rows are interleaved, so ``rope_traditional``.

    Raises:
        GGUFError: On partial rotary dims or a scaling type other than linear.
    """
    config: dict[str, Any] = {
        "rope_theta": float(f"{_meta(meta, f'{arch}.rope.freq_base', 10000.0):.7g}"),
        "rope_traditional": True,
    }
    if _meta(meta, f"{arch}.rope.dimension_count", head_dim) != head_dim:
        raise GGUFError("partial rotary embeddings are not supported by mlx-lm llama")
    scaling = _meta(meta, f"{arch}.rope.scaling.type", "none")
    if scaling == "linear":
        factor = _meta(meta, f"{arch}.rope.scaling.factor")
        config["rope_scaling"] = {"type": "linear", "factor": factor}
    elif scaling != "none":
        raise GGUFError(f"unsupported GGUF rope scaling type {scaling!r}")
    return config


def _pre_tokenizer(name: str) -> tuple[pre_tokenizers.PreTokenizer, bool]:
    """Return the HF pre-tokenizer for a ``tokenizer.ggml.pre`` name.

    Returns:
        tuple[PreTokenizer, bool]: The pre-tokenizer and whether BPE ignores
        merges for whole-word vocabulary hits (llama.cpp: llama3 only).
    """
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if name in _DIGIT_NAMES:
        digits = pre_tokenizers.Digits(individual_digits=True)
        return pre_tokenizers.Sequence([digits, byte_level]), False
    if name in _LLAMA3_NAMES or name in _QWEN2_NAMES:
        regex = _SPLIT_REGEX % ("{1,3}" if name in _LLAMA3_NAMES else "")
        split = pre_tokenizers.Split(Regex(regex), behavior="isolated", invert=False)
        no_regex = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        return pre_tokenizers.Sequence([split, no_regex]), name in _LLAMA3_NAMES
    if name not in _GPT2_NAMES:
        logger.warning("unknown GGUF pre-tokenizer %r: using the GPT-2 byte-level one", name)
    return byte_level, False


def _build_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """Build a byte-level BPE ``tokenizers.Tokenizer`` from ``tokenizer.ggml.*``.

    Control tokens (token_type 3) become special added tokens and user-defined
    ones (4) plain added tokens (GGUF spec; HF tokenizer.json ``added_tokens``).
    """
    tokens: list[str] = _meta(meta, "tokenizer.ggml.tokens")
    types: list[int] = _meta(meta, "tokenizer.ggml.token_type", [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in _meta(meta, "tokenizer.ggml.merges", [])]
    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)
    if len(vocab) != len(tokens):
        logger.warning("GGUF vocabulary has %d duplicate tokens", len(tokens) - len(vocab))
    pre, ignore_merges = _pre_tokenizer(_meta(meta, "tokenizer.ggml.pre", "default"))
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=ignore_merges)
    tokenizer = Tokenizer(bpe)
    tokenizer.pre_tokenizer = pre
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = _post_processor(meta)
    added = [(tokens[i], t == _CONTROL) for i, t in enumerate(types) if t in _ADDED_TYPES]
    tokenizer.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t, s in added if s]
    )
    tokenizer.add_tokens(
        [AddedToken(t, special=False, normalized=False) for t, s in added if not s]
    )
    return tokenizer


def _post_processor(meta: dict[str, Any]) -> processors.PostProcessor:
    """Add BOS/EOS as ``tokenizer.ggml.add_bos_token``/``add_eos_token`` ask (GGUF spec).

    Without them, llama.cpp adds BOS for llama3-style vocabularies only
    (src/llama-vocab.cpp), and so does this.
    """
    bos = _token(meta, "bos") if _add_token(meta, "bos") else None
    eos = _token(meta, "eos") if _add_token(meta, "eos") else None
    if bos is None and eos is None:
        return processors.ByteLevel(trim_offsets=False)
    head = f"{bos[0]} " if bos else ""
    tail = f" {eos[0]}" if eos else ""
    return processors.TemplateProcessing(
        single=f"{head}$A:0{tail}",
        pair=f"{head}$A:0{tail} {head}$B:1{tail}",
        special_tokens=sorted({t for t in (bos, eos) if t}, key=lambda t: t[1]),
    )


def _add_token(meta: dict[str, Any], key: str) -> bool:
    """Return ``tokenizer.ggml.add_<key>_token``, defaulting as llama.cpp does."""
    default = key == "bos" and _meta(meta, "tokenizer.ggml.pre", "default") in _LLAMA3_NAMES
    return bool(_meta(meta, f"tokenizer.ggml.add_{key}_token", default))


def _token(meta: dict[str, Any], key: str) -> tuple[str, int] | None:
    """Return (text, id) of ``tokenizer.ggml.<key>_token_id``, or None if unset."""
    token_id = _meta(meta, f"tokenizer.ggml.{key}_token_id", None)
    tokens = _meta(meta, "tokenizer.ggml.tokens")
    if token_id is None or not 0 <= token_id < len(tokens):
        return None
    return tokens[token_id], token_id


def _write_tokenizer_configs(folder: Path, meta: dict[str, Any]) -> None:
    """Write ``tokenizer_config.json`` and ``special_tokens_map.json`` (HF transformers)."""
    found = {f"{key}_token": _token(meta, key) for key in ("bos", "eos", "padding", "unknown")}
    names = {"padding_token": "pad_token", "unknown_token": "unk_token"}
    specials: dict[str, Any] = {names.get(k, k): v[0] for k, v in found.items() if v}
    tokens = _meta(meta, "tokenizer.ggml.tokens")
    types = _meta(meta, "tokenizer.ggml.token_type", [])
    named = set(specials.values())
    extra = [tokens[i] for i, t in enumerate(types) if t == _CONTROL and tokens[i] not in named]
    if extra:
        specials["additional_special_tokens"] = extra
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **specials,
        "add_bos_token": _add_token(meta, "bos"),
        "add_eos_token": _add_token(meta, "eos"),
        "clean_up_tokenization_spaces": False,
        "model_max_length": _meta(meta, f"{_meta(meta, 'general.architecture')}.context_length"),
    }
    if (template := _meta(meta, "tokenizer.chat_template", None)) is not None:
        config["chat_template"] = template
    _write_json(folder / "tokenizer_config.json", config)
    _write_json(folder / "special_tokens_map.json", specials)


def _generation_config(meta: dict[str, Any]) -> dict[str, Any]:
    """Return ``generation_config.json``: BOS, EOS (plus end-of-turn) and PAD ids."""
    config: dict[str, Any] = {}
    eos = [_meta(meta, f"tokenizer.ggml.{k}_token_id", None) for k in ("eos", "eot", "eom")]
    eos = list(dict.fromkeys(e for e in eos if e is not None))
    if (bos := _meta(meta, "tokenizer.ggml.bos_token_id", None)) is not None:
        config["bos_token_id"] = bos
    if eos:
        config["eos_token_id"] = eos[0] if len(eos) == 1 else eos
    if (pad := _meta(meta, "tokenizer.ggml.padding_token_id", None)) is not None:
        config["pad_token_id"] = pad
    return config


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

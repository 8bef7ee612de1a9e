"""Convert a CTranslate2 Whisper checkpoint into mlx-whisper's folder layout.

faster-whisper checkpoints (CTranslate2 ``WhisperSpec``, written by
``ctranslate2/converters/transformers.py`` ``WhisperLoader``) fuse each
self-attention's query, key and value projections into one ``linear_0`` (rows
``[q; k; v]``) and each cross-attention's key and value into ``linear_1``
(``[k; v]``); Whisper's key projection has no bias, so CTranslate2 stores zeros
for it (checked here, then dropped). Convolutions are ``(out, in, width)`` as in
PyTorch; MLX's ``Conv1d`` wants ``(out, width, in)``. Everything else is a
rename onto ``mlx_whisper/whisper.py``'s module names. The dimensions come from
the tensors and are checked against the checkpoint's own ``config.json``
(alignment heads, language ids).

The output folder holds ``config.json`` (``ModelDimensions``, what
``mlx_whisper.load_models.load_model`` reads), ``weights.safetensors`` (float16
as stored) and the marker :data:`MARKER_FILE` with the alignment heads and the
source's digest, written last.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from mlxspec.engine.audio.ct2 import CT2Error, CT2Model, read_model_bin

__all__ = ["CONVERTER_VERSION", "MARKER_FILE", "WhisperConvertError", "convert_ct2_whisper"]

logger = logging.getLogger("mlxspec.engine.audio")

#: Bumped whenever the output of :func:`convert_ct2_whisper` changes.
CONVERTER_VERSION = 1
#: Written last into a finished conversion folder.
MARKER_FILE = "mlxspec-whisper.json"
#: Largest |bias| accepted for the key projection's stored zeros.
_KEY_BIAS_TOLERANCE = 1e-6


class WhisperConvertError(ValueError):
    """The checkpoint is not a Whisper model this converter understands."""


def _layers(model: CT2Model, prefix: str) -> int:
    n = 0
    while f"{prefix}/layer_{n}/ffn/linear_0/weight" in model.variables:
        n += 1
    return n


def _float(model: CT2Model, name: str) -> np.ndarray:
    """A float tensor (int8 rows dequantized by their ``_scale``, bfloat16 widened)."""
    value = model.variables[name]
    if name in model.bfloat16:
        return (value.astype(np.uint32) << 16).view(np.float32).astype(np.float16)
    if value.dtype == np.int8:
        scale = model.variables.get(f"{name}_scale")
        if scale is None:
            raise WhisperConvertError(f"{name} is int8 without a scale")
        return (value.astype(np.float32) / scale.reshape(-1, 1)).astype(np.float16)
    return np.ascontiguousarray(value)


def _linear(model: CT2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    out[f"{dst}.weight"] = _float(model, f"{src}/weight")
    if f"{src}/bias" in model.variables:
        out[f"{dst}.bias"] = _float(model, f"{src}/bias")


def _norm(model: CT2Model, src: str, dst: str, out: dict[str, np.ndarray]) -> None:
    out[f"{dst}.weight"] = _float(model, f"{src}/gamma")
    out[f"{dst}.bias"] = _float(model, f"{src}/beta")


def _split(
    model: CT2Model, src: str, dst: str, names: tuple[str, ...], out: dict[str, np.ndarray]
) -> None:
    """Split a fused projection's rows into ``names`` (``key`` loses its zero bias)."""
    weight = _float(model, f"{src}/weight")
    bias = _float(model, f"{src}/bias")
    width = weight.shape[0] // len(names)
    for i, name in enumerate(names):
        rows = slice(i * width, (i + 1) * width)
        out[f"{dst}.{name}.weight"] = np.ascontiguousarray(weight[rows])
        if name == "key":
            if np.abs(bias[rows].astype(np.float32)).max() > _KEY_BIAS_TOLERANCE:
                raise WhisperConvertError(f"{src}: the key projection has a bias")
        else:
            out[f"{dst}.{name}.bias"] = np.ascontiguousarray(bias[rows])


def _block(model: CT2Model, src: str, dst: str, cross: bool, out: dict[str, np.ndarray]) -> None:
    _norm(model, f"{src}/self_attention/layer_norm", f"{dst}.attn_ln", out)
    _split(model, f"{src}/self_attention/linear_0", f"{dst}.attn", ("query", "key", "value"), out)
    _linear(model, f"{src}/self_attention/linear_1", f"{dst}.attn.out", out)
    if cross:
        _norm(model, f"{src}/attention/layer_norm", f"{dst}.cross_attn_ln", out)
        _linear(model, f"{src}/attention/linear_0", f"{dst}.cross_attn.query", out)
        _split(model, f"{src}/attention/linear_1", f"{dst}.cross_attn", ("key", "value"), out)
        _linear(model, f"{src}/attention/linear_2", f"{dst}.cross_attn.out", out)
    _norm(model, f"{src}/ffn/layer_norm", f"{dst}.mlp_ln", out)
    _linear(model, f"{src}/ffn/linear_0", f"{dst}.mlp1", out)
    _linear(model, f"{src}/ffn/linear_1", f"{dst}.mlp2", out)


def _sinusoids(length: int, channels: int) -> np.ndarray:
    """Whisper's encoder position table (openai-whisper ``model.sinusoids``)."""
    step = math.log(10000) / (channels // 2 - 1)
    scaled = np.arange(length)[:, None] * np.exp(-step * np.arange(channels // 2))[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=1)


def ct2_to_mlx(model: CT2Model) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Map a CTranslate2 ``WhisperSpec`` onto mlx-whisper's dimensions and weights.

    Args:
        model (CT2Model): the parsed ``model.bin``.

    Returns:
        tuple[dict, dict]: ``ModelDimensions`` fields and ``name -> float16 array``
        in mlx-whisper's names and layouts.

    Raises:
        WhisperConvertError: not a Whisper spec, missing tensors, a key bias,
            or an encoder position table that is not Whisper's sinusoids.
    """
    if model.spec != "WhisperSpec":
        raise WhisperConvertError(f"not a Whisper checkpoint (CTranslate2 spec {model.spec})")
    try:
        out: dict[str, np.ndarray] = {}
        for conv in ("conv1", "conv2"):
            out[f"encoder.{conv}.weight"] = np.ascontiguousarray(
                _float(model, f"encoder/{conv}/weight").transpose(0, 2, 1)
            )
            out[f"encoder.{conv}.bias"] = _float(model, f"encoder/{conv}/bias")
        n_audio, n_text = _layers(model, "encoder"), _layers(model, "decoder")
        for i in range(n_audio):
            _block(model, f"encoder/layer_{i}", f"encoder.blocks.{i}", False, out)
        _norm(model, "encoder/layer_norm", "encoder.ln_post", out)
        out["decoder.token_embedding.weight"] = _float(model, "decoder/embeddings/weight")
        out["decoder.positional_embedding"] = _float(model, "decoder/position_encodings/encodings")
        for i in range(n_text):
            _block(model, f"decoder/layer_{i}", f"decoder.blocks.{i}", True, out)
        _norm(model, "decoder/layer_norm", "decoder.ln", out)
        audio_pos = model.variables["encoder/position_encodings/encodings"]
        dims = {
            "n_mels": int(model.variables["encoder/conv1/weight"].shape[1]),
            "n_audio_ctx": int(audio_pos.shape[0]),
            "n_audio_state": int(audio_pos.shape[1]),
            "n_audio_head": model.scalar("encoder/num_heads"),
            "n_audio_layer": n_audio,
            "n_vocab": int(out["decoder.token_embedding.weight"].shape[0]),
            "n_text_ctx": int(out["decoder.positional_embedding"].shape[0]),
            "n_text_state": int(out["decoder.positional_embedding"].shape[1]),
            "n_text_head": model.scalar("decoder/num_heads"),
            "n_text_layer": n_text,
        }
    except KeyError as e:
        raise WhisperConvertError(f"the checkpoint lacks {e.args[0]}") from e
    # mlx-whisper computes the encoder's position table; it must be the stored one.
    expected = _sinusoids(dims["n_audio_ctx"], dims["n_audio_state"])
    if np.abs(audio_pos.astype(np.float32) - expected).max() > 1e-2:
        raise WhisperConvertError("the encoder's position table is not Whisper's sinusoids")
    return dims, out


def checked_alignment_heads(config: dict[str, Any], dims: dict[str, Any]) -> list[list[int]]:
    """The checkpoint config's alignment heads, checked against the dimensions
    and its language ids against the vocabulary (mlx-whisper counts languages as
    ``n_vocab - 51765 - multilingual``).

    Args:
        config (dict): the checkpoint's ``config.json`` (faster-whisper's).
        dims (dict): the dimensions read from the tensors.

    Returns:
        list[list[int]]: ``[layer, head]`` pairs (empty: use mlx-whisper's default).

    Raises:
        WhisperConvertError: a head outside the decoder, or language ids that
            do not match the vocabulary.
    """
    heads = [[int(layer), int(head)] for layer, head in config.get("alignment_heads") or []]
    for layer, head in heads:
        if not (0 <= layer < dims["n_text_layer"] and 0 <= head < dims["n_text_head"]):
            raise WhisperConvertError(f"alignment head {[layer, head]} is outside the decoder")
    multilingual = dims["n_vocab"] >= 51865
    languages = config.get("lang_ids")
    if multilingual and languages is not None:
        expected = dims["n_vocab"] - 51765 - 1
        if len(languages) != expected or min(languages) != 50259:
            raise WhisperConvertError(
                f"config.json lists {len(languages)} languages; the vocabulary has {expected}"
            )
    return heads


def convert_ct2_whisper(
    parts: list[Path], config_path: Path | None, out: Path, *, source_sha256: str
) -> Path:
    """Write the mlx-whisper folder for a CTranslate2 Whisper checkpoint.

    The folder is built beside ``out`` and renamed into place, so a reader sees
    a whole conversion or none.

    Args:
        parts (list[Path]): ``model.bin`` or its parts, in order.
        config_path (Path | None): the checkpoint's ``config.json``, if any.
        out (Path): the folder to create.
        source_sha256 (str): the digest the folder is named by (kept in the marker).

    Returns:
        Path: ``out``.

    Raises:
        WhisperConvertError: the checkpoint is not a convertible Whisper model.
        OSError: reading or writing fails.
    """
    import mlx.core as mx

    try:
        model = read_model_bin(parts)
    except CT2Error as e:
        raise WhisperConvertError(f"{parts[0]}: {e}") from e
    dims, weights = ct2_to_mlx(model)
    config = json.loads(config_path.read_text()) if config_path is not None else {}
    heads = checked_alignment_heads(config, dims)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        arrays = {k: mx.array(v) for k, v in weights.items()}
        mx.save_safetensors(str(tmp / "weights.safetensors"), arrays)
        (tmp / "config.json").write_text(json.dumps({"model_type": "whisper", **dims}, indent=2))
        marker = {
            "converter_version": CONVERTER_VERSION,
            "sha256": source_sha256,
            "source": [str(p) for p in parts],
            "alignment_heads": heads,
        }
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2))
        if (out / MARKER_FILE).is_file():  # another process converted it meanwhile
            return out
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    logger.info("converted Whisper checkpoint %s into %s", parts[0], out)
    return out

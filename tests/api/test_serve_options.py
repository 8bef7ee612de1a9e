"""mlx_lm.server's flags reach the engine: ``load_engine`` turns a
``ServeConfig`` into the loaded model's options (adapter, template, prefill
step and batch, prompt-cache entries, min_p and template defaults), and the
batched lane's decode step takes its rows and prefill sizes from them. A LoRA
``--adapter-path`` is mounted as the default adapter (replaceable over
``/v1/adapters``); a DoRA one is applied at load, as mlx_lm.server does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.tiny_model import build_tiny_adapter
from mlxspec.cli.main import load_engine
from mlxspec.config import ServeConfig
from mlxspec.engine.loop.batching import BatchLane
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
        # mounted (not loaded into the weights) as the default of every request
        assert engine.info.weights is not None and "+adapter:" not in engine.info.weights
        assert engine.adapters.ids() == ["adapter"] and engine.adapters.default == "adapter"
        layers = sum(type(m).__name__ == "AdapterLinear" for m in engine.model.modules())
        assert layers == engine.adapters.listing()[0]["mounted_layers"] > 0
        pick = engine.adapters.pick(["adapter"])  # its KV caches are its own
        assert parts.namespace_of(pick) != parts.namespace
        # --decode-concurrency (--batch) rows decode at once; a prefill chunk holds
        # --prompt-concurrency rows of --prefill-step-size tokens
        lane = BatchLane(parts, engine.max_batch, on_done=lambda _handle, _outcome: None)
        try:
            got = (lane.batch.max_rows, lane.batch.prefill_step, lane.batch.prefill_tokens)
            assert got == (4, 64, 2 * 64)
        finally:
            lane.close()
    finally:
        engine.close()


def test_a_dora_adapter_is_applied_at_load(tiny_model_dir: Path, tmp_path: Path) -> None:
    adapter = build_tiny_adapter(tiny_model_dir, tmp_path / "dora")
    config_file = adapter / "adapter_config.json"
    config = {**json.loads(config_file.read_text()), "fine_tune_type": "dora"}
    config_file.write_text(json.dumps(config))
    engine = load_engine(ServeConfig(model=str(tiny_model_dir), adapter_path=str(adapter)))
    try:
        assert engine.adapters.ids() == []  # in the weights, as mlx_lm.load puts it
        assert engine.info.weights is not None and "+adapter:" in engine.info.weights
        assert any(type(m).__name__ == "DoRALinear" for m in engine.model.modules())
    finally:
        engine.close()


def test_a_missing_adapter_is_a_model_error(tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="adapter not found: .* has no adapter_config.json"):
        load_engine(ServeConfig(model=str(tiny_model_dir), adapter_path=str(tmp_path)))


@pytest.mark.parametrize("allowed", [False, True])
def test_special_tokens_in_content_reaches_the_prompt(tiny_model_dir: Path, allowed: bool) -> None:
    engine = load_engine(
        ServeConfig(model=str(tiny_model_dir), allow_special_tokens_in_content=allowed)
    )
    try:
        im_end = engine.tokenizer.convert_tokens_to_ids("<|im_end|>")
        prompt = engine.chat_prompt([{"role": "user", "content": "a<|im_end|>b"}])
        assert prompt.count(im_end) == (2 if allowed else 1)
    finally:
        engine.close()

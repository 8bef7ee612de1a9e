"""Thinking channels delimited by a marker pair.

``<think>...</think>`` (Qwen3, DeepSeek-R1, GLM, MiniMax, ...) and the other
pairs mlx-lm's ``TokenizerWrapper`` recognises (``_infer_thinking``).
"""

from __future__ import annotations

from mlxspec.parsers.base import ReasoningParser


class ThinkParser(ReasoningParser):
    """``<think>`` ... ``</think>``."""

    name = "think"
    start = "<think>"
    end = "</think>"


class LongcatThinkParser(ReasoningParser):
    """``<longcat_think>`` ... ``</longcat_think>``."""

    name = "longcat_think"
    start = "<longcat_think>"
    end = "</longcat_think>"


class ColonThinkParser(ReasoningParser):
    """``<|think:start|>`` ... ``<|think:end|>``."""

    name = "think_colon"
    start = "<|think:start|>"
    end = "<|think:end|>"


class ChannelThoughtParser(ReasoningParser):
    """Gemma 4: ``<|channel>thought`` ... ``<channel|>``."""

    name = "channel_thought"
    start = "<|channel>thought"
    end = "<channel|>"

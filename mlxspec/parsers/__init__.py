"""Parsers that split a model's decoded text into content, reasoning and tool calls.

No HTTP and no MLX here: a parser is fed text chunks (``feed(text) ->
deltas``, then ``finish()``) and returns the deltas of :mod:`.base`. Two
families, each a lazy ``{name: (module, class)}`` registry (vLLM's
``tool_parsers/__init__.py`` pattern): tool-call formats and reasoning
markers. :func:`detect` picks both for a tokenizer, once.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from mlxspec.parsers.base import (
    CallArguments,
    CallBegin,
    CallEnd,
    Content,
    ParserDelta,
    Reasoning,
    ReasoningParser,
    ToolParser,
)

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "CallArguments",
    "CallBegin",
    "CallEnd",
    "Content",
    "ParserChoice",
    "ParserDelta",
    "Reasoning",
    "ReasoningParser",
    "ToolParser",
    "detect",
    "reasoning_parser_class",
    "tool_parser_class",
]

_P = "mlxspec.parsers."

#: Tool-call formats: name -> (module, class), imported on first use.
TOOL_PARSERS: dict[str, tuple[str, str]] = {
    "hermes": (_P + "hermes", "HermesToolParser"),
    "qwen3_coder": (_P + "qwen_xml", "QwenXmlToolParser"),
    "mistral": (_P + "mistral", "MistralToolParser"),
    "llama3_json": (_P + "llama3", "Llama3JsonToolParser"),
    "pythonic": (_P + "pythonic", "PythonicToolParser"),
    "pythonic_bare": (_P + "pythonic", "BarePythonicToolParser"),
    "gemma4": (_P + "whole", "Gemma4"),
    "function_gemma": (_P + "whole", "FunctionGemma"),
    "glm47": (_P + "whole", "Glm47"),
    "kimi_k2": (_P + "whole", "KimiK2"),
    "kimi_k3": (_P + "whole", "KimiK3"),
    "laguna": (_P + "whole", "Laguna"),
    "longcat": (_P + "whole", "Longcat"),
    "minicpm5": (_P + "whole", "MiniCpm5"),
    "minimax_m2": (_P + "whole", "MinimaxM2"),
    "muse_spark": (_P + "whole", "MuseSpark"),
}

#: Reasoning marker pairs: name -> (module, class).
REASONING_PARSERS: dict[str, tuple[str, str]] = {
    "think": (_P + "think", "ThinkParser"),
    "longcat_think": (_P + "think", "LongcatThinkParser"),
    "think_colon": (_P + "think", "ColonThinkParser"),
    "channel_thought": (_P + "think", "ChannelThoughtParser"),
}

#: mlx-lm ``tool_parsers`` module -> our registry name, where they differ.
_FROM_MLX_LM = {"json_tools": "hermes"}

#: Opening think marker -> reasoning registry name.
_THINK_MARKERS = {
    "<think>": "think",
    "<longcat_think>": "longcat_think",
    "<|think:start|>": "think_colon",
    "<|channel>thought": "channel_thought",
}


def _load(registry: dict[str, tuple[str, str]], name: str) -> Any:
    module, cls = registry[name]
    return getattr(importlib.import_module(module), cls)


def tool_parser_class(name: str) -> type[ToolParser]:
    """The tool parser class registered as ``name``.

    Raises:
        KeyError: no such format.
    """
    return _load(TOOL_PARSERS, name)


def reasoning_parser_class(name: str) -> type[ReasoningParser]:
    """The reasoning parser class registered as ``name``.

    Raises:
        KeyError: no such marker pair.
    """
    return _load(REASONING_PARSERS, name)


@dataclass(frozen=True)
class ParserChoice:
    """The formats a model writes.

    Args:
        tool (str | None): a :data:`TOOL_PARSERS` name, or ``None`` (no tool format).
        reasoning (str | None): a :data:`REASONING_PARSERS` name, or ``None``.
    """

    tool: str | None = None
    reasoning: str | None = None


def detect(tokenizer: Any) -> ParserChoice:
    """Choose the tool-call and reasoning parsers for a tokenizer.

    Tool format: mlx-lm's own inference first (``TokenizerWrapper.tool_parser``,
    from ``tool_parser_type`` in tokenizer_config.json or the chat template),
    then the template markers mlx-lm does not look for (Hermes without
    ``tool_call.name``, Llama 3 JSON, Llama pythonic); a template that never
    reads ``tools`` gets Hermes, the convention the prompt then uses. Reasoning: mlx-lm's
    ``think_start`` (a think token in the vocabulary) or ``<think>`` in the template.

    Args:
        tokenizer: an mlx-lm ``TokenizerWrapper`` or anything with a
            ``chat_template`` attribute.

    Returns:
        ParserChoice: the registry names.
    """
    template = template_text(getattr(tokenizer, "chat_template", None))
    tool = None
    inferred = getattr(tokenizer, "tool_parser", None)
    module = getattr(inferred, "__module__", "") or ""
    if module.startswith("mlx_lm.tool_parsers."):
        short = module.rsplit(".", 1)[-1]
        tool = _FROM_MLX_LM.get(short, short if short in TOOL_PARSERS else None)
    if tool is None:
        tool = _tool_from_template(template)
    if tool is None and "tools" not in template:
        # the template drops tools, so the prompt describes them with the Hermes
        # convention (engine.prompt.with_tool_instruction): read replies that way
        tool = "hermes"
    start = getattr(tokenizer, "think_start", None)
    if not isinstance(start, str):
        start = next((m for m in _THINK_MARKERS if m in template), None)
    return ParserChoice(tool=tool, reasoning=_THINK_MARKERS.get(start or ""))


def _tool_from_template(template: str) -> str | None:
    if "<function=" in template and "<parameter=" in template:
        return "qwen3_coder"
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|tool_call_start|>" in template:
        return "pythonic"
    if "<|python_tag|>" in template or '"parameters": dictionary of argument' in template:
        return "llama3_json"
    if "[func_name1(" in template:
        return "pythonic_bare"
    return None


def template_text(template: Any) -> str:
    """A chat template as one string: Hugging Face allows a dict or a list of named
    templates (``[{"name": ..., "template": ...}]``), joined here; anything else is ``""``."""
    if isinstance(template, str):
        return template
    if isinstance(template, dict):
        return "\n".join(str(v) for v in template.values())
    if isinstance(template, list):
        return "\n".join(str(t.get("template", "")) for t in template if isinstance(t, dict))
    return ""

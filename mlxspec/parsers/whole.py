"""Blocks parsed once they are complete, by a function (mlx-lm's tool parsers).

For formats whose markup is not JSON (pythonic calls, the families only
mlx-lm's ``tool_parsers`` know) the call is sent when its block closes: one
:class:`CallBegin`, the whole arguments JSON, :class:`CallEnd`.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mlxspec.parsers.args import ArgumentsWriter, decode_arguments, tool_properties
from mlxspec.parsers.base import CallArguments, CallBegin, CallEnd, ParserDelta, ToolParser

log = logging.getLogger("mlxspec.parsers")

ParseFn = Callable[[str, Sequence[Mapping[str, Any]]], Any]


def calls_delta(calls: Any, tools: Sequence[Mapping[str, Any]], raw: bool) -> list[ParserDelta]:
    """Deltas for parsed calls: a ``{"name", "arguments"}`` dict or a list of them.

    Args:
        calls: a parser's result.
        tools (Sequence[Mapping]): the request's tools, for schema decoding.
        raw (bool): argument values are raw markup text (see ``decode_value``).

    Returns:
        list: ``CallBegin``, ``CallArguments``, ``CallEnd`` per call.
    """
    out: list[ParserDelta] = []
    for call in calls if isinstance(calls, list) else [calls]:
        name = call.get("name") if isinstance(call, Mapping) else None
        arguments = call.get("arguments") if isinstance(call, Mapping) else None
        if not isinstance(name, str) or not name:
            continue
        if not isinstance(arguments, Mapping):
            arguments = {}
        decoded = decode_arguments(arguments, tool_properties(tools, name), raw)
        out += [CallBegin(name), CallArguments(ArgumentsWriter().close(decoded)), CallEnd()]
    return out


class WholeBlock:
    """Buffers a block and parses it at :meth:`close` with ``parse``.

    Args:
        tools (Sequence[Mapping]): the request's tools.
        parse (Callable): ``parse(text, tools)`` returning a call dict or a
            list of them; any exception means "not a call".
        raw (bool): argument values are raw text. Default: ``False``.
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]], parse: ParseFn, raw: bool = False):
        self.tools, self.parse, self.raw = tools, parse, raw
        self.text: list[str] = []

    def feed(self, text: str) -> list[ParserDelta]:
        """Buffer more of the block (nothing is certain before it closes)."""
        self.text.append(text)
        return []

    def close(self) -> list[ParserDelta] | None:
        """Parse the block; ``None`` when it holds no call."""
        try:
            calls = self.parse("".join(self.text), list(self.tools))
        except Exception:  # any parser failure: the markup becomes content
            log.debug("tool call markup did not parse", exc_info=True)
            return None
        return calls_delta(calls, self.tools, self.raw) or None


class MlxLmToolParser(ToolParser):
    """A format handled by ``mlx_lm.tool_parsers.<module>``: its markers and
    its ``parse_tool_call``, reused as they are. Subclasses set ``module``."""

    module = ""

    def __init__(self, tools: Sequence[Mapping[str, Any]] = ()) -> None:
        super().__init__(tools)
        self._module = importlib.import_module(f"mlx_lm.tool_parsers.{self.module}")

    @property
    def start(self) -> str:  # type: ignore[override]
        return self._module.tool_call_start

    @property
    def end(self) -> str:  # type: ignore[override]
        return self._module.tool_call_end

    def open_block(self) -> WholeBlock:
        return WholeBlock(self.tools, self._module.parse_tool_call, raw=True)


def _family(module: str) -> type[MlxLmToolParser]:
    return type(
        module.title().replace("_", ""), (MlxLmToolParser,), {"module": module, "name": module}
    )


# One class per mlx-lm family we do not parse incrementally ourselves.
Gemma4 = _family("gemma4")
FunctionGemma = _family("function_gemma")
Glm47 = _family("glm47")
KimiK2 = _family("kimi_k2")
KimiK3 = _family("kimi_k3")
Laguna = _family("laguna")
Longcat = _family("longcat")
MiniCpm5 = _family("minicpm5")
MinimaxM2 = _family("minimax_m2")
MuseSpark = _family("muse_spark")

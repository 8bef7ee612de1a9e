"""Per-turn tool and template options: the pure part of opening a chat turn.

What a chat body asks of the parsers (:class:`TurnOptions`), the template
variables it implies (:func:`template_kwargs`), and the grammar that forces a
tool call (:func:`forcing_constraint`). No engine and no I/O here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mlxspec.engine import Constraint
from mlxspec.errors import ApiError
from mlxspec.parsers import ParserChoice
from mlxspec.parsers.forcing import tool_call_constraint


@dataclass(frozen=True)
class TurnOptions:
    """What the parsers need to know about a turn.

    Args:
        tools (tuple[dict, ...]): the request's OpenAI function tools. Default: ``()``.
        tool_choice (Any): ``"auto"``, ``"none"``, ``"required"`` or
            ``{"type": "function", "function": {"name": ...}}``. Default: ``"auto"``.
        parallel_tool_calls (bool): allow more than one call. Default: ``True``.
    """

    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True


def turn_options(body: Mapping[str, Any]) -> TurnOptions:
    """The parser options of an OpenAI-shaped chat body (pure).

    Raises:
        ApiError: a forcing ``tool_choice`` without ``tools``, or naming a
            function that is not among them (400, ``param: tool_choice``).
    """
    tools = tuple(body.get("tools") or ())
    choice = body.get("tool_choice")
    choice = "auto" if choice is None else choice
    if (choice == "required" or isinstance(choice, Mapping)) and not tools:
        raise ApiError(
            "invalid_request", "tool_choice requires tools to be specified", param="tool_choice"
        )
    if isinstance(choice, Mapping):
        name = choice["function"]["name"]
        if not any((t.get("function") or {}).get("name") == name for t in tools):
            raise ApiError(
                "invalid_request",
                f"tool_choice names function '{name}', which is not in tools",
                param="tool_choice",
            )
    return TurnOptions(
        tools=tools,
        tool_choice=choice,
        parallel_tool_calls=body.get("parallel_tool_calls") is not False,
    )


def template_kwargs(
    body: Mapping[str, Any], template: str = "", defaults: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    """The chat template variables of a body (pure).

    ``chat_template_kwargs`` as given, over the server's ``defaults``
    (mlx_lm.server merges a request's over its ``--chat-template-args`` the same
    way); ``reasoning_effort`` sets ``enable_thinking`` (``"none"`` off, any
    other level on) unless the client set it explicitly, and reaches templates
    that read a ``reasoning_effort`` variable (gpt-oss) as is (reference, chat
    request body).

    Args:
        body (Mapping): the chat body.
        template (str): the chat template text. Default: ``""``.
        defaults (Mapping | None): the server's template variables. Default: ``None``.

    Returns:
        dict | None: the variables, or ``None`` when there are none.
    """
    client = body.get("chat_template_kwargs") or {}
    kwargs = {**(defaults or {}), **client}
    effort = body.get("reasoning_effort")
    if effort is not None:
        if "enable_thinking" not in client:
            kwargs["enable_thinking"] = effort != "none"
        if "reasoning_effort" in template:
            kwargs.setdefault("reasoning_effort", effort)
    return kwargs or None


def forcing_constraint(options: TurnOptions, choice: ParserChoice, thinking: bool) -> Constraint:
    """The grammar of a forcing ``tool_choice`` (``required`` or a named function).

    Raises:
        ApiError: the model's tool-call format cannot be forced (400).
    """
    parser = tool_parser_name(options, choice) or ""
    constraint = tool_call_constraint(
        parser, options.tools, options.tool_choice, options.parallel_tool_calls, thinking
    )
    if constraint is None:
        what = "required" if options.tool_choice == "required" else "a named function"
        raise ApiError(
            "invalid_request",
            f"tool_choice {what} cannot be enforced for this model's tool-call format ({parser})",
            param="tool_choice",
        )
    return constraint


def forcing_instruction(options: TurnOptions) -> str:
    """The system instruction that asks for a forced tool call whose grammar
    cannot be enforced (the degrade path of :func:`forcing_constraint`; pure).

    Args:
        options (TurnOptions): a forcing ``tool_choice`` and its tools.

    Returns:
        str: the instruction, naming the function (or saying any of the tools).
    """
    how = "in the tool-call format described, and write nothing else"
    if isinstance(options.tool_choice, Mapping):
        name = options.tool_choice["function"]["name"]
        return f"Reply only with a call to the function {name}, {how}."
    calls = "calls to one or more" if options.parallel_tool_calls else "one call to one"
    return f"Reply only with {calls} of the tools provided, {how}."


def tool_parser_name(options: TurnOptions, choice: ParserChoice) -> str | None:
    """The tool format to parse: none when tools are off; a model without a
    known format is read (and forced) as Hermes ``<tool_call>`` JSON."""
    if not options.tools or options.tool_choice == "none":
        return None
    if choice.tool is None and options.tool_choice != "auto":
        return "hermes"
    return choice.tool

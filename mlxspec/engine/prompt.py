"""Prompt building: chat messages through the model's chat template, and raw text.

Messages are normalized first (:mod:`.prompt_messages`); a template that
renders no tools gets them as text (:mod:`.tool_prompt`); client text is
tokenized as text, never as control tokens (:mod:`.literal_text`).

Building a prompt is CPU work proportional to its size (a multi-megabyte body
takes seconds), so handlers run it through :func:`off_loop` on a few
dedicated threads instead of the event loop (:func:`template_off_loop` when
the request brings its own chat template, rendered within a budget by
:mod:`.template_sandbox`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from mlxspec.engine.literal_text import Protected, literal_text
from mlxspec.engine.prompt_messages import mark_tool_errors, normalize_messages
from mlxspec.engine.system_turns import inline_system_turns
from mlxspec.engine.template_sandbox import TemplateBudget, render_template, request_template
from mlxspec.engine.text_bound import TextBound
from mlxspec.engine.tool_prompt import (
    TOOL_INSTRUCTION,
    template_renders_tools,
    with_tool_history,
    with_tool_instruction,
)
from mlxspec.engine.types import PromptError

__all__ = [
    "PROMPT_THREADS",
    "RESERVED_TEMPLATE_ARGS",
    "TOOL_INSTRUCTION",
    "dedupe_bos",
    "encode_text",
    "normalize_messages",
    "off_loop",
    "quiet_length_warning",
    "render_chat",
    "template_off_loop",
    "template_renders_tools",
    "token_prompt",
    "with_tool_history",
    "with_tool_instruction",
]

T = TypeVar("T")

#: Threads that build prompts. More than the cores would not build faster; a
#: few let a small prompt start while a huge one is still being tokenized.
PROMPT_THREADS = 4
_BUILDERS = concurrent.futures.ThreadPoolExecutor(PROMPT_THREADS, "mlxspec-prompt")


async def off_loop(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run prompt building (``fn(*args, **kwargs)``) on a prompt thread and
    await it, so the event loop keeps serving other clients meanwhile.

    Thread safety, with the engine thread detokenizing through the same
    tokenizer: template rendering reads only its arguments, and a Hugging Face
    fast tokenizer encodes and decodes under a shared borrow of its Rust core
    (``encode_batch``, which also releases the GIL). Only switching truncation
    or padding borrows it exclusively (the "Already borrowed" error);
    transformers switches them on an encode only when they differ from the
    requested state, which is settled by the encode the engine's constructor
    makes, and nothing here asks for truncation or padding.

    Args:
        fn (Callable[..., T]): the work, e.g. ``Engine.chat_prompt``.
        *args: positional arguments of ``fn``.
        **kwargs: keyword arguments of ``fn``.

    Returns:
        T: what ``fn`` returned.

    Raises:
        Exception: whatever ``fn`` raised (e.g. :class:`PromptError`).
    """
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_BUILDERS, functools.partial(fn, *args, **kwargs))


#: Threads that render templates requests bring (:mod:`.template_sandbox`):
#: apart from :data:`_BUILDERS`, so a flood of them never queues the
#: prompts of requests that use the model's template.
TEMPLATE_THREADS = 2
_TEMPLATE_RENDERERS = concurrent.futures.ThreadPoolExecutor(TEMPLATE_THREADS, "mlxspec-template")


async def template_off_loop(fn: Callable[..., T], *args: Any) -> T:
    """:func:`off_loop` on the threads for requests that bring their own
    chat template (``fn`` renders one).

    Args:
        fn (Callable[..., T]): the work.
        *args: positional arguments of ``fn``.

    Returns:
        T: what ``fn`` returned.

    Raises:
        Exception: whatever ``fn`` raised.
    """
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_TEMPLATE_RENDERERS, functools.partial(fn, *args))


def render_chat(
    tokenizer: Any,
    messages: list[dict],
    *,
    tools: list | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    budget: TemplateBudget | None = None,
    bound: TextBound | None = None,
    special_in_content: bool = False,
    encode: Callable[[str], list[int]] | None = None,
) -> list[int]:
    """Render messages with the chat template and tokenize, as mlx_lm.server does
    (a rendered text longer than ``bound`` allows is a ``ContextLengthError``,
    never tokenized).

    The rendered text is encoded without adding special tokens (the template
    writes its own), then a doubled BOS is reduced to one. Special-token
    strings in the client's text (contents, tool arguments and results, tool
    definitions) are tokenized as text, never as control tokens
    (:mod:`.literal_text`), unless ``special_in_content``
    (``--allow-special-tokens-in-content``). A failed tool result
    (``is_error``) is shown as one (:func:`.prompt_messages.mark_tool_errors`). With
    ``continue_final_message`` among ``template_kwargs`` the last message (an
    assistant prefill) is left open for the model to continue, instead of
    closed and followed by a new generation prompt (transformers'
    ``apply_chat_template`` option, as vLLM exposes it). A template the
    request brings (``chat_template`` among ``template_kwargs``, other than
    the name of one of the model's) renders within ``budget``
    (:mod:`.template_sandbox`); the model's own renders unbounded.

    Args:
        tokenizer: an ``mlx_lm`` ``TokenizerWrapper`` (or HF tokenizer).
        messages (list[dict]): output of :func:`normalize_messages`.
        tools (list | None): OpenAI tool definitions for the template. Default: ``None``.
        template_kwargs (Mapping | None): extra template variables. Default: ``None``.
        budget (TemplateBudget | None): the bounds of a request's template.
            Default: ``None`` (:class:`~.template_sandbox.TemplateBudget`'s defaults).
        bound (TextBound | None): the longest rendered text tokenized. Default: ``None``.
        special_in_content (bool): let special-token strings in client text
            be control tokens. Default: ``False``.
        encode (Callable[[str], list[int]] | None): tokenizes the rendered text
            instead (a vision model's processor, which expands image markers:
            :mod:`.media.prompt`); client text is then not kept literal.
            Default: ``None``.

    Returns:
        list[int]: prompt token ids (what ``encode`` returned, when given).

    Raises:
        PromptError: the model has no chat template (and the request brings
            none), ``messages`` is empty, the template failed or rendered
            nothing (a model cannot continue an empty prompt).
        TemplateBoundError: a request's template ran past ``budget``.
    """
    kwargs = dict(template_kwargs or {})
    source = request_template(tokenizer, kwargs)
    template = source if source is not None else getattr(tokenizer, "chat_template", None)
    if source is None and not template:
        raise PromptError("model has no chat template; use /v1/completions", param="messages")
    if not messages:  # e.g. a Responses body with `input: []` (templates raise their own words)
        raise PromptError("the conversation is empty: send at least one message", param="messages")
    messages = mark_tool_errors(messages, template)
    if not template_renders_tools(template):
        # The template knows no tools: calls and results in the history become
        # text in the syntax the tool instruction teaches.
        messages = with_tool_history(messages)
        if tools:
            messages, tools = with_tool_instruction(messages, tools), None
    taken = sorted(RESERVED_TEMPLATE_ARGS.intersection(kwargs))
    if taken:
        raise PromptError(
            f"chat_template_kwargs cannot set {', '.join(map(repr, taken))}: "
            "the server sets it when it renders the prompt",
            param="chat_template_kwargs",
        )
    continuing = bool(kwargs.get("continue_final_message"))
    literal = literal_text(tokenizer)
    protected: list[Protected] = []
    if not special_in_content and encode is None:
        protected = [literal.protect(messages), literal.protect(tools)]
        messages, tools = protected[0].value, protected[1].value
    try:
        try:
            text = _apply(tokenizer, source, budget, messages, tools, kwargs)
        except PromptError:
            raise
        except Exception:
            if not any(m.get("role") == "system" for m in messages[1:]):
                raise
            # Many templates refuse a system turn after the first message.
            text = _apply(tokenizer, source, budget, inline_system_turns(messages), tools, kwargs)
    except PromptError:  # the budget, or a template that is no Jinja
        raise
    except Exception as exc:  # jinja2 TemplateError, TypeError from bad values
        if continuing:  # transformers' message would quote the whole rendered prompt
            raise PromptError(
                "prompt build failed: the chat template cannot continue the final message",
                param="messages",
            ) from exc
        raise PromptError(f"prompt build failed: {exc}", param="messages") from exc
    if bound is not None:
        bound.check(literal.restore(text, protected), "messages")
    if encode is not None:
        return encode(text)
    tokens = dedupe_bos(literal.encode(text, protected), tokenizer.bos_token_id)
    if not tokens:  # e.g. a chat_template_kwargs "chat_template" that renders nothing
        raise PromptError("the chat template rendered an empty prompt", param="messages")
    return tokens


def _apply(
    tokenizer: Any,
    source: Any,
    budget: TemplateBudget | None,
    messages: list[dict],
    tools: list | None,
    kwargs: dict[str, Any],
) -> str:
    """The prompt text: the model's template, or (``source``) the request's, in the sandbox."""
    if source is not None:
        return _render_request_template(tokenizer, source, budget, messages, tools, kwargs)
    continuing = bool(kwargs.get("continue_final_message"))
    return tokenizer.apply_chat_template(
        messages,
        tools=tools or None,
        add_generation_prompt=not continuing,
        tokenize=False,
        **kwargs,
    )


def _render_request_template(
    tokenizer: Any,
    source: Any,
    budget: TemplateBudget | None,
    messages: list[dict],
    tools: list | None,
    kwargs: dict[str, Any],
) -> str:
    """``apply_chat_template``'s text for a request's own template, in the sandbox."""
    variables = {k: v for k, v in kwargs.items() if k != "chat_template"}
    continuing = bool(variables.pop("continue_final_message", False))
    special = dict(getattr(tokenizer, "special_tokens_map", None) or {})
    return render_template(
        source,
        budget or TemplateBudget(),
        messages,
        tools=tools or None,
        add_generation_prompt=not continuing,
        continue_final_message=continuing,
        variables={**special, **variables},  # as transformers: the request's win
    )


#: ``apply_chat_template`` parameters the server sets itself: a client value
#: would collide with ours (a ``TypeError`` quoting Python internals) or
#: change what rendering returns.
RESERVED_TEMPLATE_ARGS = frozenset(
    {
        "add_generation_prompt",
        "conversation",
        "documents",
        "max_length",
        "padding",
        "return_assistant_tokens_mask",
        "return_dict",
        "return_tensors",
        "tokenize",
        "tokenizer_kwargs",
        "tools",
        "truncation",
    }
)


def dedupe_bos(tokens: list[int], bos_id: int | None) -> list[int]:
    """Drop a second leading BOS token.

    Args:
        tokens (list[int]): token ids.
        bos_id (int | None): the tokenizer's BOS id, if any.

    Returns:
        list[int]: ``tokens`` without a duplicated leading BOS.
    """
    if bos_id is not None and len(tokens) >= 2 and tokens[0] == tokens[1] == bos_id:
        return tokens[1:]
    return tokens


#: transformers' once-per-tokenizer flag for its "Token indices sequence length
#: is longer than the specified maximum sequence length" warning
#: (``PreTrainedTokenizerBase._eventual_warn_about_too_long_sequence``).
_TOO_LONG_WARNING = "sequence-length-is-longer-than-the-specified-maximum"


def quiet_length_warning(tokenizer: Any) -> None:
    """Stop ``tokenizer`` warning that a long encode "will result in indexing errors".

    transformers logs that line the first time an encode is longer than the
    tokenizer's ``model_max_length``. Here nothing runs such a prompt: the
    engine's admission answers an over-long prompt with a 400
    (``context_length_exceeded``) after encoding it, so the line only misleads
    an operator. Marking transformers' own warn-once flag as spent silences
    that one message on this tokenizer; every other warning, and other
    tokenizers, are untouched.

    Args:
        tokenizer: a Hugging Face tokenizer or mlx-lm's ``TokenizerWrapper``
            around one; anything without transformers' flags is left alone.
    """
    flags = getattr(tokenizer, "deprecation_warnings", None)
    if isinstance(flags, dict):
        flags[_TOO_LONG_WARNING] = True


def encode_text(tokenizer: Any, prompt: str, bound: TextBound | None = None) -> list[int]:
    """Tokenize a raw completion prompt exactly as ``mlx_lm.server``
    (``tokenizer.encode(prompt)``, the tokenizer's own BOS handling).

    Raises:
        PromptError: the prompt encodes to no tokens.
        ContextLengthError: it is longer than ``bound`` allows (not tokenized).
    """
    if bound is not None:
        bound.check(prompt, "prompt")
    tokens = list(tokenizer.encode(prompt))
    if not tokens:
        raise PromptError("the prompt is empty after tokenization", param="prompt")
    return tokens


def token_prompt(ids: Sequence[int], vocab_size: int | None, param: str = "prompt") -> list[int]:
    """A pre-tokenized input (OpenAI's token-id ``prompt``, or an embeddings
    ``input`` of token ids), used as given.

    The document has checked that ``ids`` is a non-empty list of non-negative
    integers; only the model knows the upper bound, and MLX's embedding lookup
    does not bounds-check (an id past the table reads other memory or fails
    deep in the forward pass).

    Args:
        ids (Sequence[int]): token ids of the served model.
        vocab_size (int | None): rows of the model's embedding table; ``None``
            if unknown (then unchecked).
        param (str): the request field the ids came from. Default: ``"prompt"``.

    Returns:
        list[int]: ``ids`` as a new list (nothing added, no BOS).

    Raises:
        PromptError: a negative id or one not below ``vocab_size`` (its ``param``).
    """
    tokens = list(ids)
    top = vocab_size if vocab_size is not None else float("inf")
    bad = next((t for t in tokens if not 0 <= t < top), None)
    if bad is not None:
        span = f"0 to {vocab_size - 1}" if vocab_size is not None else "non-negative"
        raise PromptError(
            f"{param} token {bad} is not a token id of this model (token ids are {span})",
            param=param,
        )
    return tokens

"""Prompt building: chat messages through the model's chat template, and raw text.

Message normalisation follows ``mlx_lm.server.process_message_content``:
text-part arrays are joined, ``content: null`` becomes ``""`` and tool-call
``arguments`` given as a JSON string are decoded to an object, because chat
templates render ``arguments | tojson``. Assistant ``reasoning`` is exposed as
``reasoning_content`` (the name Qwen-style templates read) unless that is given,
even empty (reference, chat request body). Media parts on a text-only model are
a :class:`PromptError`, never silently dropped.

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
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from mlxspec.engine.system_turns import inline_system_turns
from mlxspec.engine.template_sandbox import TemplateBudget, render_template, request_template
from mlxspec.engine.text_bound import TextBound
from mlxspec.engine.types import PromptError

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


_MEDIA_PARTS = {"image_url", "image", "input_audio", "audio", "audio_url", "video_url", "video"}


def normalize_messages(messages: Sequence[Mapping[str, Any]], model_id: str) -> list[dict]:
    """Return template-ready copies of OpenAI chat messages.

    Args:
        messages (Sequence[Mapping]): validated request messages.
        model_id (str): served model id, named in media errors.

    Returns:
        list[dict]: new message dicts; the input is not mutated.

    Raises:
        PromptError: a media part (image/audio/video) on this text-only model,
            or a content part without text.
    """
    out = []
    for i, message in enumerate(messages):
        msg = dict(message)
        msg["content"] = _content_text(msg.get("content"), model_id, f"messages[{i}].content")
        if msg.get("tool_calls"):
            msg["tool_calls"] = [_decode_arguments(tc) for tc in msg["tool_calls"]]
        if isinstance(msg.get("reasoning"), str) and not isinstance(
            msg.get("reasoning_content"), str
        ):
            msg["reasoning_content"] = msg["reasoning"]
        out.append(msg)
    return out


def _content_text(content: Any, model_id: str, param: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    pieces = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind in _MEDIA_PARTS:
            raise PromptError(
                f"model {model_id} is text-only: '{kind}' content parts are not supported",
                param=f"{param}[{j}]",
            )
        if kind != "text" or not isinstance(part.get("text"), str):
            raise PromptError(
                f"unsupported content part type '{kind}': a prompt here holds text (and "
                "images or audio on a model that reads them)",
                param=f"{param}[{j}]",
            )
        pieces.append(part["text"])
    return "".join(pieces)


def _decode_arguments(tool_call: Mapping[str, Any]) -> dict:
    call = dict(tool_call)
    function = dict(call.get("function") or {})
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            function["arguments"] = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            pass  # templates that print arguments verbatim still get the string
    call["function"] = function
    return call


def render_chat(
    tokenizer: Any,
    messages: list[dict],
    *,
    tools: list | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
    budget: TemplateBudget | None = None,
    bound: TextBound | None = None,
) -> list[int]:
    """Render messages with the chat template and tokenize, as mlx_lm.server does
    (a rendered text longer than ``bound`` allows is a ``ContextLengthError``,
    never tokenized).

    The rendered text is encoded without adding special tokens (the template
    writes its own), then a doubled BOS is reduced to one. With
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

    Returns:
        list[int]: prompt token ids.

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
        bound.check(text, "messages")
    tokens = dedupe_bos(tokenizer.encode(text, add_special_tokens=False), tokenizer.bos_token_id)
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


def template_renders_tools(template: Any) -> bool:
    """Whether a chat template reads the ``tools`` variable at all (a template
    that does not would silently drop the request's tool definitions).

    Args:
        template: the tokenizer's ``chat_template`` (a string, or a list/dict of
            named templates as some tokenizer configs store them).
    """
    return "tools" in str(template)


#: The instruction that carries tools to a model whose template ignores them:
#: the Hermes ``<tool_call>`` convention, which the hermes parser then reads.
TOOL_INSTRUCTION = (
    "Functions you may call:\n{tools}\n"
    'To call one, reply <tool_call>{{"name":...,"arguments":{{...}}}}</tool_call>'
)


def with_tool_instruction(messages: list[dict], tools: list) -> list[dict]:
    """``messages`` with the tool definitions described in the leading system
    message (merged into an existing one), for templates that do not render
    ``tools`` (llama.cpp's server does the same for such templates).

    Args:
        messages (list[dict]): normalized chat messages.
        tools (list): OpenAI tool definitions.

    Returns:
        list[dict]: a new list; ``messages`` is not mutated.
    """
    described = [t.get("function", t) for t in tools]
    listed = json.dumps(described, ensure_ascii=False, separators=(",", ":"))
    text = TOOL_INSTRUCTION.format(tools=listed)
    if messages and messages[0].get("role") == "system":
        first = dict(messages[0])
        first["content"] = f"{first.get('content') or ''}\n\n{text}".strip()
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def with_tool_history(messages: list[dict]) -> list[dict]:
    """``messages`` with tool calls and tool results written as text, for
    templates that do not render ``tools`` (and so neither ``tool_calls`` nor
    ``tool`` turns) and would otherwise show a calling assistant turn empty.

    Each assistant call becomes ``<tool_call>{"name": ..., "arguments": {...}}
    </tool_call>`` (one line per call, after the turn's text), the syntax
    :data:`TOOL_INSTRUCTION` teaches and the hermes parser reads. A run of
    ``tool`` messages becomes one ``user`` turn holding each result as
    ``<tool_response>\\n...\\n</tool_response>``, as Qwen 2.5's template
    renders them: such a template may not know a ``tool`` role at all.

    Args:
        messages (list[dict]): normalized chat messages.

    Returns:
        list[dict]: a new list; ``messages`` is not mutated.
    """
    out: list[dict] = []
    previous = None
    for message in messages:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            calls = [_call_text(call) for call in message["tool_calls"]]
            text = "\n".join([message["content"], *calls] if message["content"] else calls)
            out.append({k: v for k, v in message.items() if k != "tool_calls"} | {"content": text})
        elif role == "tool":
            result = f"<tool_response>\n{message['content']}\n</tool_response>"
            if previous == "tool":  # parallel calls' results share one turn
                out[-1]["content"] += "\n" + result
            else:
                out.append({"role": "user", "content": result})
        else:
            out.append(message)
        previous = role
    return out


def _call_text(call: Mapping[str, Any]) -> str:
    function = call.get("function") or {}
    body = {"name": function.get("name"), "arguments": function.get("arguments", {})}
    return f"<tool_call>{json.dumps(body, ensure_ascii=False)}</tool_call>"


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

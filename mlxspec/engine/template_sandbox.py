"""Render a chat template that came with a request, within a budget.

A request may bring its own chat template (``chat_template_kwargs.chat_template``,
when the operator allows it: ``--allow-request-templates``). Jinja's sandbox
keeps such a template away from Python internals but not from the CPU:
``{% for i in range(100000) %}{% for j in range(100000) %}`` renders for hours.
So a request's template renders here, not through transformers'
``apply_chat_template``, in a sandboxed environment that counts its steps:

* a step is a loop iteration, a call (function, method, macro), a filter or
  test, an intercepted operator (``+``, ``*``, ``**``, ``%``, ``~``) or a piece
  of output; a render may take :attr:`TemplateBudget.steps` of them, and the
  clock (:attr:`TemplateBudget.seconds`) and the stop flag (the client left)
  are checked at every step;
* no value a step makes, nor the output, may exceed
  :attr:`TemplateBudget.chars` characters (or items), and the operations that
  multiply a size in one step (``"x" * n``, ``**``, ``replace``, ``center``,
  ``indent``, ``join``, format widths, ...) are refused before they build one
  larger, so the longest single step works on at most that many characters
  or items.

The environment gives templates what transformers' does
(``transformers.utils.chat_template_utils._compile_jinja_template``: the
immutable sandbox, ``trim_blocks``, ``lstrip_blocks``, loop controls, the
``{% generation %}`` tag, ``raise_exception``, ``strftime_now``, ``tojson``,
``dict`` and ``namespace``) and renders what ``apply_chat_template`` renders
(messages without ``None`` values, reasoning under its aliases, the special
tokens, ``continue_final_message``). Jinja's ``lipsum`` global is left out (one
call writes any number of paragraphs). The model's own template is the
operator's and does not come here.
"""

from __future__ import annotations

import functools
import json
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.visitor import NodeTransformer

from mlxspec.engine.types import PromptError

#: The request field that carries a template, named in this module's errors.
TEMPLATE_PARAM = "chat_template_kwargs.chat_template"


#: Default :attr:`TemplateBudget.steps`: an 800-message conversation with 20
#: tools takes about 7,000 through a Qwen 2.5-style template.
DEFAULT_TEMPLATE_STEPS = 100_000
#: Default :attr:`TemplateBudget.seconds`.
DEFAULT_TEMPLATE_SECONDS = 2.0


@dataclass(frozen=True)
class TemplateBudget:
    """How far one render of a request's chat template may go.

    Args:
        steps (int): most steps (see the module docstring). Default: ``100000``.
        seconds (float): most wall-clock seconds. Default: ``2.0``.
        chars (int): most characters (or items) of any value, and of the
            output. Default: ``4 * 2**20``.
        stop (threading.Event): set it to stop the render at its next step
            (the client left). Default: a new event.
    """

    steps: int = DEFAULT_TEMPLATE_STEPS
    seconds: float = DEFAULT_TEMPLATE_SECONDS
    chars: int = 4 * 2**20
    stop: threading.Event = field(default_factory=threading.Event, compare=False, repr=False)


class TemplateBoundError(PromptError):
    """A request's chat template ran past its budget, or was stopped."""


class _Halt(BaseException):
    """Unwinds a render past any ``except Exception`` in Jinja or a filter."""

    def __init__(self, error: TemplateBoundError) -> None:
        super().__init__(error.message)
        self.error = error


class _Meter:
    """The steps, clock and sizes of one render (a thread's current one)."""

    def __init__(self, budget: TemplateBudget) -> None:
        self.budget = budget
        self.left = budget.steps
        self.deadline = time.monotonic() + budget.seconds

    def step(self) -> None:
        self.left -= 1
        if self.left < 0:
            bound = f"{self.budget.steps} steps (--request-template-steps)"
            self.halt(f"ran past this server's bound of {bound}")
        if self.budget.stop.is_set():
            self.halt("was stopped: the request ended")
        if time.monotonic() > self.deadline:
            bound = f"{self.budget.seconds:g} seconds (--request-template-seconds)"
            self.halt(f"ran past this server's bound of {bound}")

    def fits(self, size: int) -> None:
        if size > self.budget.chars:
            bound = f"{self.budget.chars} characters or items"
            self.halt(f"would build a value over this server's bound of {bound}")

    def sized(self, value: Any) -> Any:
        if isinstance(value, (str, list, tuple, dict)):
            self.fits(len(value))
        return value

    def halt(self, why: str) -> None:
        message = f"the request's chat template ({TEMPLATE_PARAM}) {why}"
        raise _Halt(TemplateBoundError(message, param=TEMPLATE_PARAM))


_ACTIVE = threading.local()


def _meter() -> _Meter:
    return _ACTIVE.meter


class _Counted:
    """An iterable whose every item is a step (a loop's iterable)."""

    def __init__(self, iterable: Iterable[Any], meter: _Meter) -> None:
        self.iterable, self.meter = iterable, meter

    def __iter__(self) -> Iterator[Any]:
        for item in self.iterable:
            self.meter.step()
            yield item

    def __len__(self) -> int:
        return len(self.iterable)  # type: ignore[arg-type]  # a TypeError tells Jinja to count


@jinja2.pass_context
def _loop_filter(context: Any, iterable: Iterable[Any]) -> _Counted:
    # pass_context: Jinja never folds it into a constant at compile time.
    return _Counted(iterable, _meter())


@jinja2.pass_context
def _concat_filter(context: Any, parts: list[Any]) -> str:
    meter = _meter()
    meter.step()
    texts = [str(part) for part in parts]
    meter.fits(sum(map(len, texts)))
    return "".join(texts)


class _Rewrite(NodeTransformer):
    """Routes every loop's iterable and every ``~`` through the meter."""

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, "_mlxspec_loop", [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        items = nodes.List(node.nodes, lineno=node.lineno)
        return nodes.Filter(items, "_mlxspec_concat", [], [], None, None, lineno=node.lineno)


#: A width or precision in a %-format, a format spec or a strftime directive.
_FORMAT_WIDTH = re.compile(r"[%:.][-+ #0_^<>=]*(\d+)")
#: A format spec whose width comes from an argument (``"{:{}}".format(s, n)``).
_NESTED_FIELD = re.compile(r"\{[^{}]*\{")


def _estimate(name: str, subject: Any, args: tuple, kwargs: Mapping[str, Any]) -> int:
    """The size of what ``subject.name(*args)`` (a string method, or the filter
    of that name on ``subject``) would build, for the operations that can
    multiply a size in one step; ``0`` for the others."""

    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name in ("center", "ljust", "rjust", "zfill"):
        width = arg(0, "width", 0)
        return width if isinstance(width, int) else 0
    if not isinstance(subject, (str, list, tuple)):
        return 0
    if name == "join":
        separator, items = (
            (subject, arg(0, "iterable"))
            if isinstance(subject, str)
            else (
                arg(0, "d", ""),
                subject,
            )
        )
        if not isinstance(items, (list, tuple)) or not isinstance(separator, str):
            return 0
        texts = sum(len(item) for item in items if isinstance(item, str))
        return texts + len(separator) * len(items)
    if not isinstance(subject, str):
        return 0
    if name == "replace":
        old, new, count = arg(0, "old", ""), arg(1, "new", ""), arg(2, "count")
        if not isinstance(old, str) or not isinstance(new, str):
            return 0
        hits = subject.count(old) if old else len(subject) + 1
        if isinstance(count, int) and count >= 0:
            hits = min(hits, count)
        return len(subject) + hits * max(0, len(new) - len(old))
    if name == "indent":
        width = arg(0, "width", 4)
        width = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
        return len(subject) + (subject.count("\n") + 1) * width
    if name == "expandtabs":
        size = arg(0, "tabsize", 8)
        return len(subject) + subject.count("\t") * (size if isinstance(size, int) else 0)
    if name in ("format", "format_map", "%", "strftime_now"):
        widths = _FORMAT_WIDTH.findall(subject)
        if any(len(width) > 9 for width in widths):
            return 10**10
        numbers = [a for a in (*args, *kwargs.values()) if isinstance(a, int)]
        starred = "*" in subject or _NESTED_FIELD.search(subject) is not None
        sizes = [int(width) for width in widths] + (numbers if starred else [])
        return len(subject) + max([0, *sizes])
    return 0


def _batch_size(name: str, args: tuple, kwargs: Mapping[str, Any]) -> int:
    """Items ``batch``/``slice`` would pad or create (their count argument)."""
    if name == "batch" and (len(args) > 2 or kwargs.get("fill_with") is not None):
        count = args[1] if len(args) > 1 else kwargs.get("linecount", 0)
    elif name == "slice":
        count = args[1] if len(args) > 1 else kwargs.get("slices", 0)
    else:
        return 0
    return count if isinstance(count, int) else 0


def _counted(name: str, fn: Any) -> Callable[..., Any]:
    """A filter or test ``fn`` that takes a step, refuses a result over the
    size bound before building it (:func:`_estimate`) and checks the one it built."""
    skip = 1 if getattr(fn, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(fn)  # keeps jinja_pass_arg, so Jinja passes what fn expects
    def counted(*args: Any, **kwargs: Any) -> Any:
        meter = _meter()
        meter.step()
        if len(args) > skip:
            rest = args[skip + 1 :]
            meter.fits(_estimate(name, args[skip], rest, kwargs))
            meter.fits(_batch_size(name, args[skip:], kwargs))
        return meter.sized(fn(*args, **kwargs))

    return counted


def _power_bits(base: Any, exponent: Any) -> int:
    if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
        return abs(base).bit_length() * exponent
    return 0


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` renders its body, as in
    transformers (where it also marks assistant tokens, unused here)."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


class _Namespace(jinja2.utils.Namespace):
    """transformers' ``TemplateNamespace``: no underscore-prefixed attributes."""

    def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's signature trick
        self, rest = args[0], args[1:]
        for name in dict(*rest, **kwargs):
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, *rest, **kwargs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                "chat templates cannot store underscore-prefixed attributes on a "
                f"namespace: {name!r}"
            )


class _Dict:
    """transformers' ``TemplateDict``: ``dict(...)`` and ``dict.fromkeys(...)`` only."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:  # noqa: A002 - the name templates pass
    meter = _meter()
    meter.fits(_estimate("strftime_now", format, (), {}))
    return datetime.now().strftime(format)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """transformers' chat template environment, every step metered."""

    intercepted_binops = frozenset({"+", "*", "**", "%"})

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationTag, jinja2.ext.loopcontrols],
        )
        self.filters["tojson"] = _tojson
        self.filters = {name: _counted(name, fn) for name, fn in self.filters.items()}
        self.tests = {name: _counted(name, fn) for name, fn in self.tests.items()}
        self.filters["_mlxspec_loop"] = _loop_filter
        self.filters["_mlxspec_concat"] = _concat_filter
        self.globals.pop("lipsum", None)
        self.globals.update(
            raise_exception=_raise_exception,
            strftime_now=_strftime_now,
            dict=_Dict(),
            namespace=_Namespace,
        )

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        meter = _meter()
        meter.step()
        if isinstance(__obj, LoopContext) and args:  # a recursive loop's next level
            args = (_Counted(args[0], meter), *args[1:])
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
        owner = getattr(method, "__self__", None)
        if isinstance(owner, str):  # a string method
            meter.fits(_estimate(getattr(method, "__name__", ""), owner, args, kwargs))
        return meter.sized(super().call(__context, __obj, *args, **kwargs))

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        meter = _meter()
        meter.step()
        if operator == "*":
            for seq, times in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(times, int):
                    meter.fits(len(seq) * times)
        elif operator == "**":
            meter.fits(_power_bits(left, right) // 8)
        elif operator == "%" and isinstance(left, str):
            values = right if isinstance(right, tuple) else (right,)
            meter.fits(_estimate("%", left, values, {}))
        return meter.sized(super().call_binop(context, operator, left, right))


_ENVIRONMENT = _BoundedEnvironment()


@functools.lru_cache(maxsize=16)
def _compiled(source: str) -> jinja2.Template:
    """``source`` compiled with every loop and ``~`` metered (agents send the
    same template again and again)."""
    tree = _Rewrite().visit(_ENVIRONMENT.parse(source))
    tree.set_environment(_ENVIRONMENT)
    return _ENVIRONMENT.from_string(tree)


#: transformers' marker for ``continue_final_message`` (``render_jinja_template``).
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


def render_template(
    source: str,
    budget: TemplateBudget,
    messages: list[dict],
    *,
    tools: list | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    variables: Mapping[str, Any] | None = None,
) -> str:
    """Render a request's chat template within ``budget``, as
    ``apply_chat_template(..., tokenize=False)`` would render it.

    Args:
        source (str): the template text (Jinja).
        budget (TemplateBudget): the render's bounds and stop flag.
        messages (list[dict]): the conversation (JSON values only).
        tools (list | None): tool definitions for the template. Default: ``None``.
        add_generation_prompt (bool): open an assistant turn. Default: ``True``.
        continue_final_message (bool): leave the last message open instead
            (transformers' option). Default: ``False``.
        variables (Mapping | None): other template variables (the special
            tokens, the request's ``chat_template_kwargs``). Default: ``None``.

    Returns:
        str: the rendered prompt text.

    Raises:
        TemplateBoundError: the render ran past ``budget`` or was stopped.
        PromptError: ``source`` is not a string or not valid Jinja (naming
            :data:`TEMPLATE_PARAM`).
        ValueError: a final message the template does not keep open.
        Exception: what the template raised (``raise_exception``'s
            ``TemplateError``, a ``TypeError`` from bad values, ...).
    """
    if not isinstance(source, str):
        raise PromptError("the chat template must be a string", param=TEMPLATE_PARAM)
    chat = [_template_message(m) for m in messages]
    final = chat[-1].get("content") if chat else None
    if continue_final_message:
        if not isinstance(final, str) or "content" not in source:
            raise ValueError("the chat template cannot continue the final message")
        chat[-1]["content"] = final + _CONTINUE_TAG
    meter = _Meter(budget)
    _ACTIVE.meter = meter
    try:
        try:
            template = _compiled(source)
        except jinja2.TemplateSyntaxError as exc:
            raise PromptError(
                f"the chat template is not valid Jinja: {exc}", param=TEMPLATE_PARAM
            ) from exc
        context = {**(variables or {}), "messages": chat, "tools": tools, "documents": None}
        context["add_generation_prompt"] = add_generation_prompt
        pieces, size = [], 0
        for piece in template.generate(context):
            meter.step()
            size += len(piece)
            meter.fits(size)
            pieces.append(piece)
    except _Halt as halt:
        raise halt.error from None
    finally:
        del _ACTIVE.meter
    text = "".join(pieces)
    return _cut_at_tag(text, str(final)) if continue_final_message else text


def _template_message(message: Mapping[str, Any]) -> dict:
    """A message as transformers hands it to a template: ``None`` values
    dropped, reasoning under each name templates read."""
    out = {k: v for k, v in message.items() if v is not None}
    reasoning = next((out[k] for k in _REASONING_FIELDS if k in out), None)
    if reasoning is not None:
        out = {"thinking": reasoning, **out, "reasoning_content": reasoning}
    return out


def _cut_at_tag(text: str, final: str) -> str:
    """The rendered text up to the open final message (transformers' cut)."""
    tag = _CONTINUE_TAG.strip()
    if final.strip() not in text or tag not in text:
        raise ValueError("the chat template cannot continue the final message")
    at = text.rindex(tag)
    return text[:at] if text[at : at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else text[:at].rstrip()


def request_template(tokenizer: Any, template_kwargs: Mapping[str, Any] | None) -> Any:
    """The chat template a request's ``chat_template_kwargs`` bring, or ``None``.

    ``chat_template_kwargs.chat_template`` that names one of the model's own
    templates (a tokenizer with several, e.g. ``"tool_use"``) is the
    operator's, selected as transformers selects it: ``None`` here.

    Args:
        tokenizer: the served tokenizer.
        template_kwargs (Mapping | None): the request's template variables.

    Returns:
        The template the request brings (a string, unless the client sent
        another type), or ``None``.
    """
    value = (template_kwargs or {}).get("chat_template")
    named = getattr(tokenizer, "chat_template", None)
    if value is None or (isinstance(named, dict) and isinstance(value, str) and value in named):
        return None
    return value

"""The sandbox that renders a request's own chat template within a budget.

Pure tests of :mod:`mlxspec.engine.template_sandbox`: every kind of template
bomb stops at a bound with a 400-shaped error, and what a normal template
renders is what transformers' ``apply_chat_template`` renders.
"""

from __future__ import annotations

import threading

import pytest

from mlxspec.engine import TemplateBoundError, TemplateBudget
from mlxspec.engine.prompt import normalize_messages, render_chat
from mlxspec.engine.template_sandbox import TEMPLATE_PARAM, render_template, request_template
from mlxspec.engine.types import PromptError

MESSAGES = [{"role": "user", "content": "hi"}]
#: Nested loops that would render for hours unbounded.
LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
STEPS = "ran past this server's bound of 1000 steps (--request-template-steps)"
SIZE = "would build a value over this server's bound of 10000 characters or items"
#: Each bomb, and how far it gets under ``TemplateBudget(steps=1000, chars=10000)``.
BOMBS = {
    "nested loops": (LOOPS, STEPS),
    "output": ("{% for i in range(100000) %}x{% endfor %}", STEPS),
    "macro recursion": (
        "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
        "{{ f(40) }}",
        STEPS,
    ),
    "recursive loop": (
        "{% for x in [range(100000)] recursive %}"
        "{% if loop.depth < 4 %}{{ loop([range(100000)] * 100) }}{% endif %}{% endfor %}",
        STEPS,
    ),
    "filter per item": ("{{ range(100000) | select('odd') | list | length }}", STEPS),
    "repeat": ("{{ 'x' * 1000000000 }}", SIZE),
    "power": ("{{ 2 ** 1000000000 }}", SIZE),
    "doubling ~": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}",
        SIZE,
    ),
    "doubling +": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s + ns.s %}"
        "{% endfor %}",
        SIZE,
    ),
    "replace": ("{% set s = 'x' * 5000 %}{{ s.replace('x', s) }}", SIZE),
    "replace filter": ("{% set s = 'x' * 5000 %}{{ s | replace('x', s) }}", SIZE),
    "center": ("{{ 'x' | center(1000000000) }}", SIZE),
    "ljust": ("{{ 'x'.ljust(1000000000) }}", SIZE),
    "indent": ("{{ ('a\n' * 1000) | indent(1000) }}", SIZE),
    "join": ("{% set s = 'x' * 5000 %}{{ ([s] * 100) | join }}", SIZE),
    "format width": ("{{ '%01000000000d' % 1 }}", SIZE),
    "format spec": ("{{ '{:{}}'.format(1, 1000000000) }}", SIZE),
    "batch padding": ("{{ [1] | batch(1000000000, 0) | list }}", SIZE),
    "strftime width": ("{{ strftime_now('%1000000000Y') }}", SIZE),
}


@pytest.mark.parametrize("name", list(BOMBS))
def test_a_bomb_stops_at_its_bound(name: str) -> None:
    source, why = BOMBS[name]
    with pytest.raises(TemplateBoundError) as err:
        render_template(source, TemplateBudget(steps=1000, chars=10000), MESSAGES)
    assert (err.value.message, err.value.param) == (
        f"the request's chat template ({TEMPLATE_PARAM}) {why}",
        TEMPLATE_PARAM,
    )


def test_the_clock_and_the_stop_flag_end_a_render() -> None:
    with pytest.raises(TemplateBoundError) as err:
        render_template(LOOPS, TemplateBudget(steps=10**12, seconds=0.05), MESSAGES)
    assert "bound of 0.05 seconds (--request-template-seconds)" in err.value.message
    stop = threading.Event()
    threading.Timer(0.05, stop.set).start()
    with pytest.raises(TemplateBoundError) as err:
        render_template(LOOPS, TemplateBudget(steps=10**12, seconds=600, stop=stop), MESSAGES)
    assert err.value.message.endswith("was stopped: the request ended")


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("{{ lipsum(1000000000) }}", "'lipsum' is undefined"),  # left out of the globals
        ("{{ ''.__class__ }}", None),  # the sandbox still guards internals (renders nothing)
        ("{% set ns = namespace(_x=1) %}", "underscore-prefixed attributes"),
        ("{{ raise_exception('no') }}", "no"),
    ],
)
def test_the_sandbox_keeps_its_rules(source: str, error: str | None) -> None:
    if error is None:
        assert render_template(source, TemplateBudget(), MESSAGES) == ""
        return
    with pytest.raises(Exception, match=error):
        render_template(source, TemplateBudget(), MESSAGES)


def test_a_template_that_is_no_jinja_names_the_field() -> None:
    with pytest.raises(PromptError) as err:
        render_template("{% for %}", TemplateBudget(), MESSAGES)
    assert err.value.param == TEMPLATE_PARAM
    assert err.value.message.startswith("the chat template is not valid Jinja: ")


#: A Qwen 2.5-style template: tools, tool calls, tool results, loop variables.
QWEN_STYLE = (
    "{%- if tools %}{{- '<|im_start|>system\\n# Tools\\n<tools>' }}{%- for tool in tools %}"
    "{{- '\\n' }}{{- tool | tojson }}{%- endfor %}{{- '\\n</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{- '<|im_start|>assistant' }}{%- if message.content %}{{- '\\n' + message.content }}"
    "{%- endif %}{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    '{{- \'\\n<tool_call>\\n{"name": "\' }}{{- tool_call.name }}{{- \'", "arguments": \' }}'
    "{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != 'tool' %}"
    "{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' ~ message.content ~ '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- else %}{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- if message.reasoning_content %}({{ message.thinking }}){% endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
    "{{- bos_token if greet is defined else '' }}"
)
CONVERSATION = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "weather?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "function": {"name": "w", "arguments": {"c": "x"}}}],
    },
    {"role": "tool", "content": "sunny"},
    {"role": "tool", "content": "warm"},
    {"role": "assistant", "content": "Sunny", "reasoning_content": "easy"},
]
TOOLS = [{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("continuing", [False, True])
def test_it_renders_what_transformers_renders(tiny_engine, continuing: bool) -> None:
    tokenizer = tiny_engine.tokenizer
    expected = tokenizer.apply_chat_template(
        CONVERSATION,
        tools=TOOLS,
        chat_template=QWEN_STYLE,
        tokenize=False,
        add_generation_prompt=not continuing,
        continue_final_message=continuing,
        greet=1,
    )
    got = render_template(
        QWEN_STYLE,
        TemplateBudget(),
        CONVERSATION,
        tools=TOOLS,
        add_generation_prompt=not continuing,
        continue_final_message=continuing,
        variables={**tokenizer.special_tokens_map, "greet": 1},
    )
    assert got == expected
    # reasoning reaches the template under its aliases (the continued turn ends before it)
    assert ("(easy)" in got) is not continuing


def test_render_chat_uses_a_request_template_and_its_variables(tiny_engine) -> None:
    tokenizer = tiny_engine.tokenizer
    template = (
        "{% for m in messages %}{{ m.role | upper }}: {{ m.content }} ({{ mood }})\n{% endfor %}"
    )
    kwargs = {"chat_template": template + "{% if add_generation_prompt %}BOT:{% endif %}"}
    messages = normalize_messages([{"role": "user", "content": "hello"}], "m")
    tokens = render_chat(tokenizer, messages, template_kwargs={**kwargs, "mood": "calm"})
    assert tokenizer.decode(tokens) == "USER: hello (calm)\nBOT:"


def test_a_name_of_the_models_own_templates_is_the_operators() -> None:
    class Named:
        chat_template = {"default": "a", "tool_use": "b"}

    assert request_template(Named(), {"chat_template": "tool_use"}) is None
    assert request_template(Named(), {"chat_template": "{{ x }}"}) == "{{ x }}"
    assert request_template(Named(), {"enable_thinking": True}) is None
    assert request_template(Named(), None) is None

"""Chat templates: the hardened sandbox refuses every attack class with a stable code, renders
benign Hugging Face-style templates exactly as the plain sandbox does, and never raises anything
but a GuardError. Vulnerable-engine attacks run only inside guard.isolation.run_limited."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jinja2 import nodes
from jinja2.compiler import CodeGenerator
from jinja2.ext import loopcontrols
from jinja2.nodes import EvalContext, Impossible
from jinja2.sandbox import ImmutableSandboxedEnvironment

from guard.budget import Budget, Limits
from guard.errors import GuardError, LimitExceeded, TemplateError
from guard.isolation import run_limited
from guard.jinja import (
    CODE_DEADLINE,
    CODE_EXPANSION,
    CODE_INVALID,
    CODE_KWARG_NOT_ALLOWED,
    CODE_LOOP_BUDGET,
    CODE_NESTING,
    CODE_NOT_ALLOWED,
    CODE_RAISED,
    CODE_RENDER_FAILED,
    CODE_SECURITY,
    CODE_TOO_LARGE,
    CODE_VALUE_TOO_LARGE,
    DEFAULT_LIMITS,
    ChatTemplateLimits,
    HardenedEnvironment,
    check_chat_template,
    compile_chat_template,
    hf_tojson,
    raise_exception,
    render_chat_template,
)
from scheduler_ref.chat_template import (
    DEFAULT_CHAT_TEMPLATE,
    SPECIAL_TOKENS,
    compile_vulnerable,
    render_chat,
)
from scheduler_ref.profiles import HARDENED, VULNERABLE

# Python warns about generated template code like ``{{ 0[1] }}``; generated templates are large.
pytestmark = [
    pytest.mark.filterwarnings("ignore::SyntaxWarning"),
    pytest.mark.filterwarnings("ignore:Generating overly large repr"),
]

MiB = 1 << 20
PROMPT_TOKENS_EXCEEDED = "prompt_tokens_exceeded"
KNOWN_CODES = {
    CODE_DEADLINE,
    CODE_EXPANSION,
    CODE_INVALID,
    CODE_LOOP_BUDGET,
    CODE_NESTING,
    CODE_RAISED,
    CODE_RENDER_FAILED,
    CODE_SECURITY,
    CODE_TOO_LARGE,
    CODE_VALUE_TOO_LARGE,
    PROMPT_TOKENS_EXCEEDED,
}
SEED = "{{" * 1024 + "system_prompt}}" * 512


class FakeCounter:
    """Stands in for guard.tokens._counter' IncrementalCount: about 4 characters per token."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.chars = 0
        self.feeds = 0

    def feed(self, text: str) -> None:
        self.chars += len(text)
        self.feeds += 1
        if self.limit is not None and self.finish() > self.limit:
            raise LimitExceeded(PROMPT_TOKENS_EXCEEDED, f"more than {self.limit} tokens")

    def finish(self) -> int:
        return (self.chars + 3) // 4


def fake_budget(max_tokens: int | None = 2048) -> Budget:
    return Budget(Limits(max_tokens=max_tokens), tokens=FakeCounter(max_tokens))


MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "  What is the weather in Paris?  "},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    },
    {"role": "tool", "content": '{"temp_c": 21, "sky": "clear"}'},
    {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
    {"role": "user", "content": "Thanks! And <tomorrow>?"},
]
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string", "description": "City name"}},
                "required": ["city"],
            },
        },
    }
]


def hardened(source: str, limits: ChatTemplateLimits = DEFAULT_LIMITS, **variables: Any) -> str:
    return render_chat_template(source, variables, limits=limits)


def refusal(source: str, limits: ChatTemplateLimits = DEFAULT_LIMITS, **variables: Any) -> str:
    with pytest.raises(GuardError) as info:
        render_chat_template(source, variables, limits=limits)
    return info.value.code


# ------------------------------------------------------------------------------ attack classes

BUDGETS_ONLY = replace(DEFAULT_LIMITS, deadline_s=None)


ATTACKS: list[tuple[str, str, str]] = [
    # (id, template, code)
    (
        "nested-range-99999",
        "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
        CODE_VALUE_TOO_LARGE,
    ),
    (
        "nested-empty-loops",
        "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}",
        CODE_LOOP_BUDGET,
    ),
    (
        "nested-loops-over-a-string",
        "{% set s = 'x' * 5000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
        CODE_LOOP_BUDGET,
    ),
    (
        "loop-filter-test",
        "{% for a in range(10000) %}{% for b in range(10000) if b < 0 %}{% endfor %}{% endfor %}",
        CODE_LOOP_BUDGET,
    ),
    ("str-times-huge", "{{ 'A' * 10**10 }}", CODE_VALUE_TOO_LARGE),
    ("int-times-str", "{{ 10**10 * 'A' }}", CODE_VALUE_TOO_LARGE),
    ("list-times-huge", "{{ [0] * 10**9 }}", CODE_VALUE_TOO_LARGE),
    ("pow-huge", "{{ 10**(10**7) }}", CODE_VALUE_TOO_LARGE),
    ("pow-tower", "{{ 2**(2**(2**(2**(2**2)))) }}", CODE_VALUE_TOO_LARGE),
    ("int-times-int", "{% set x = 2**4000 %}{{ x * x }}", CODE_VALUE_TOO_LARGE),
    (
        "str-doubling-plus",
        "{% set ns = namespace(s='ab') %}"
        "{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        CODE_VALUE_TOO_LARGE,
    ),
    (
        "str-doubling-tilde",
        "{% set ns = namespace(s='ab') %}"
        "{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        CODE_VALUE_TOO_LARGE,
    ),
    (
        "list-doubling",
        "{% set ns = namespace(l=[1]) %}"
        "{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}",
        CODE_VALUE_TOO_LARGE,
    ),
    ("printf-width", "{{ '%999999999s' % 'x' }}", CODE_VALUE_TOO_LARGE),
    ("printf-star-width", "{{ '%*s' % (999999999, 'x') }}", CODE_VALUE_TOO_LARGE),
    ("printf-precision", "{{ '%.999999999f' % 1.5 }}", CODE_VALUE_TOO_LARGE),
    ("printf-repr-of-shared-list", "{{ '%s' % ([['x' * 1000] * 1000]) }}", CODE_VALUE_TOO_LARGE),
    ("printf-mapping", "{{ '%(a)s%(a)s' % {'a': ['y' * 1000] * 200} }}", CODE_VALUE_TOO_LARGE),
    ("format-filter-width", "{{ '%999999999s'|format('x') }}", CODE_VALUE_TOO_LARGE),
    ("center", "{{ 'a'|center(999999999) }}", CODE_VALUE_TOO_LARGE),
    ("indent", "{{ 'a\nb'|indent(999999999) }}", CODE_VALUE_TOO_LARGE),
    ("indent-string", "{{ ('a\n' * 5000)|indent('x' * 1000) }}", CODE_VALUE_TOO_LARGE),
    (
        "wordwrap-wrapstring",
        "{{ ('ab ' * 20000)|wordwrap(1, wrapstring='x' * 100) }}",
        CODE_VALUE_TOO_LARGE,
    ),
    ("wordwrap-input", "{{ ('a' * 65537)|wordwrap(1) }}", CODE_VALUE_TOO_LARGE),
    ("replace-empty-needle", "{{ ('a' * 1000)|replace('', 'b' * 1000) }}", CODE_VALUE_TOO_LARGE),
    (
        "replace-growth",
        "{{ ('a' * 10000)|replace('a', 'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb') }}",
        CODE_VALUE_TOO_LARGE,
    ),
    ("join-size", "{{ (['x' * 1000] * 1000)|join }}", CODE_VALUE_TOO_LARGE),
    ("join-nested-lists", "{{ [['x' * 1000] * 1000, 1]|join }}", CODE_VALUE_TOO_LARGE),
    ("batch-fill", "{{ [1]|batch(10**9, 0)|list }}", CODE_VALUE_TOO_LARGE),
    ("slice-count", "{{ [1]|slice(10**9)|list }}", CODE_VALUE_TOO_LARGE),
    ("round-precision", "{{ 5|round(-10**9) }}", CODE_VALUE_TOO_LARGE),
    ("tojson-indent", "{{ [1, [2]]|tojson(indent=10**9) }}", CODE_VALUE_TOO_LARGE),
    ("tojson-size", "{{ (['x' * 1000] * 1000)|tojson }}", CODE_VALUE_TOO_LARGE),
    ("string-filter", "{{ ([['x' * 1000] * 1000] * 10)|string }}", CODE_VALUE_TOO_LARGE),
    ("output-of-shared-list", "{{ [['x' * 1000] * 1000] * 10 }}", CODE_VALUE_TOO_LARGE),
    ("str-ljust", "{{ 'a'.ljust(999999999) }}", CODE_VALUE_TOO_LARGE),
    ("str-rjust", "{{ 'a'.rjust(999999999) }}", CODE_VALUE_TOO_LARGE),
    ("str-center", "{{ 'a'.center(999999999) }}", CODE_VALUE_TOO_LARGE),
    ("str-zfill", "{{ 'a'.zfill(999999999) }}", CODE_VALUE_TOO_LARGE),
    ("str-expandtabs", "{{ ('\t' * 1000).expandtabs(1000) }}", CODE_VALUE_TOO_LARGE),
    ("str-replace", "{{ ('a' * 1000).replace('', 'b' * 1000) }}", CODE_VALUE_TOO_LARGE),
    ("str-join", "{{ ('x' * 1000).join(['y'] * 1000) }}", CODE_VALUE_TOO_LARGE),
    ("str-translate", "{{ ('x' * 1000).translate({120: 'y' * 1000}) }}", CODE_VALUE_TOO_LARGE),
    ("str-format-width", "{{ '{:>999999999}'.format('a') }}", CODE_VALUE_TOO_LARGE),
    ("str-format-nested-width", "{{ '{:>{}}'.format('a', 999999999) }}", CODE_VALUE_TOO_LARGE),
    ("str-format-precision", "{{ '{:.999999999f}'.format(1.5) }}", CODE_VALUE_TOO_LARGE),
    ("str-format-repeat", "{{ ('{0}' * 200).format('x' * 10000) }}", CODE_VALUE_TOO_LARGE),
    ("str-format-map", "{{ '{a:>999999999}'.format_map({'a': 1}) }}", CODE_VALUE_TOO_LARGE),
    ("int-to-bytes", "{{ (1).to_bytes(10**9, 'big') }}", CODE_VALUE_TOO_LARGE),
    ("bool-to-bytes", "{{ true.to_bytes(10**9, 'big') }}", CODE_VALUE_TOO_LARGE),
    ("strftime-width", "{{ strftime_now('%1000000000Y') }}", CODE_VALUE_TOO_LARGE),
    ("strftime-flag-width", "{{ strftime_now('%-1000000000d') }}", CODE_VALUE_TOO_LARGE),
    ("range-overflow", "{{ range(10**100)|length }}", CODE_VALUE_TOO_LARGE),
    (
        "slice-retention",
        "{% set ns = namespace(l=[]) %}{% set big = 'x' * 200000 %}"
        "{% for i in range(10000) %}{% set ns.l = ns.l + [big[i:]] %}{% endfor %}",
        CODE_EXPANSION,
    ),
    (
        "set-block-buffer",
        "{% set x %}{% for i in range(10000) %}{{ 'y' * 100000 }}{% endfor %}{% endset %}",
        CODE_EXPANSION,
    ),
    (
        "macro-buffer",
        "{% macro m() %}{% for i in range(10000) %}{{ 'y' * 100000 }}{% endfor %}"
        "{% endmacro %}{{ m() }}",
        CODE_EXPANSION,
    ),
    ("output-flood", "{% for i in range(10000) %}{{ 'y' * 100000 }}{% endfor %}", CODE_EXPANSION),
    (
        "macro-infinite-recursion",
        "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
        CODE_NESTING,
    ),
    (
        "macro-binary-recursion",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}"
        "{% endif %}{% endmacro %}{{ f(40) }}",
        CODE_LOOP_BUDGET,
    ),
    (
        "recursive-loop",
        "{% for x in [[1]] recursive %}{{ loop([x, x]) }}{% endfor %}",
        CODE_NESTING,
    ),
    (
        "recursive-loop-wide",
        "{% for x in [1] recursive %}{% if loop.depth < 30 %}"
        "{{ loop(range(3)) }}{% endif %}{% endfor %}",
        CODE_LOOP_BUDGET,
    ),
    ("lipsum-removed", "{{ lipsum(10**6) }}", CODE_RENDER_FAILED),
    ("pprint-removed", "{{ [1]|pprint }}", CODE_INVALID),
    ("sum-of-lists", "{{ [[1]] * 100|sum(start=[]) }}", CODE_RENDER_FAILED),
    ("bytes-printf", "{{ 'x'.encode() % () }}", CODE_SECURITY),
    ("attribute-escape", "{{ ''.__class__.__mro__[1].__subclasses__() }}", CODE_SECURITY),
    ("mutation", "{% set l = [1] %}{{ l.append(2) }}", CODE_SECURITY),
    ("raise-exception", "{{ raise_exception('Conversation roles must alternate') }}", CODE_RAISED),
    ("syntax-error", "{% for %}", CODE_INVALID),
    ("unclosed-tag", "{{ messages ", CODE_INVALID),
    ("plus-chain", "{{ " + " + ".join(["1"] * 500) + " }}", CODE_NESTING),
    ("filter-chain", "{{ 'x'" + "|trim" * 400 + " }}", CODE_NESTING),
    ("brackets", "{{ " + "(" * 100 + "1" + ")" * 100 + " }}", CODE_NESTING),
    ("lists", "{{ " + "[" * 40 + "]" * 40 + " }}", CODE_NESTING),
    ("blocks", "{% if 1 %}" * 40 + "x" + "{% endif %}" * 40, CODE_NESTING),
    ("set-blocks", "{% set a %}" * 40 + "x" + "{% endset %}" * 40, CODE_NESTING),
    ("seed-payload", SEED, CODE_NESTING),
    ("too-large", "x" * (64 * 1024 + 1), CODE_TOO_LARGE),
    ("too-many-tokens", "{{ x }}" * 7000, CODE_TOO_LARGE),
]


@pytest.mark.parametrize(("source", "code"), [a[1:] for a in ATTACKS], ids=[a[0] for a in ATTACKS])
def test_hardened_refuses_attack(source: str, code: str) -> None:
    # Decided by the budgets alone: with the other core busy a render may pass the default 1 s
    # deadline before the budget it is meant to cross (the deadline has tests of its own).
    assert refusal(source, BUDGETS_ONLY, messages=MESSAGES) == code


def test_hardened_attacks_cost_little_memory_in_a_child() -> None:
    # The worst shapes together, under a 256 MiB cap: each is refused with its code.
    sources = [a[1] for a in ATTACKS if a[2] in (CODE_LOOP_BUDGET, CODE_EXPANSION)]
    sources += ["{{ 'A' * 10**10 }}", "{{ 10**(10**7) }}", SEED]
    result = run_limited(_hardened_codes, sources, mem_limit_bytes=256 * MiB, timeout_s=30.0)
    assert result.outcome == "ok", result
    assert result.value is not None
    assert all(code in KNOWN_CODES for code in result.value), result.value
    assert result.peak_rss_bytes < 200 * MiB


def _hardened_codes(sources: list[str]) -> list[str]:
    codes = []
    for source in sources:
        try:
            render_chat_template(source, {"messages": MESSAGES})
            codes.append("ok")
        except GuardError as exc:
            codes.append(exc.code)
    return codes


def _hardened_compiled_code(source: str) -> str:
    code = HardenedEnvironment().compile(source, raw=True)
    assert isinstance(code, str)
    return code


def test_pow_is_not_folded_at_compile_time() -> None:
    # Run in a child: if folding happened, only the child would burn.
    result = run_limited(
        _hardened_compiled_code, "{{ 10**(10**7) }}", mem_limit_bytes=256 * MiB, timeout_s=10.0
    )
    assert result.outcome == "ok", result
    code = result.value
    assert code is not None
    assert "call_binop(context, '**'" in code
    assert re.search(r"\d{9,}", code) is None  # no folded constant
    env = HardenedEnvironment()
    ctx = EvalContext(env)
    for node_type in (nodes.Pow, nodes.Mul, nodes.Add, nodes.Mod):
        with pytest.raises(Impossible):
            node_type(nodes.Const(10), nodes.Const(7)).as_const(ctx)


def test_filters_are_not_folded_at_compile_time() -> None:
    code = _hardened_compiled_code("{{ 'a'|center(5) }}{{ 'a' ~ 'b' }}{{ 'abc'[1:] }}")
    assert "'  a  '" not in code
    assert "guard_concat" in code
    assert "guard_slice" in code


def test_loop_iterables_are_counted() -> None:
    code = _hardened_compiled_code("{% for x in xs if x %}{{ x }}{% endfor %}")
    assert "environment.guard_iter(" in code


# ------------------------------------------------------------------------------ budgets and time


def test_output_is_charged_to_the_budget_while_generating() -> None:
    counter = FakeCounter(50)
    budget = Budget(Limits(max_tokens=50), tokens=counter)
    source = "{% for i in range(1000) %}{{ 'word ' * 10 }}{% endfor %}"
    with pytest.raises(LimitExceeded) as info:
        render_chat_template(source, {}, budget=budget)
    assert info.value.code == PROMPT_TOKENS_EXCEEDED
    # Stopped after a few chunks, not after rendering all 1000.
    assert counter.feeds < 10


def test_budget_counts_the_rendered_prompt() -> None:
    budget = fake_budget()
    text = render_chat_template(DEFAULT_CHAT_TEMPLATE, _chat_vars(), budget=budget)
    assert budget.tokens_used() == (len(text) + 3) // 4


class StepClock:
    """A clock that stays at 0 for ``still`` reads, then jumps far ahead."""

    def __init__(self, still: int) -> None:
        self.reads = 0
        self.still = still

    def __call__(self) -> float:
        self.reads += 1
        return 0.0 if self.reads <= self.still else 1e9


def test_deadline_is_checked_inside_loops() -> None:
    limits = replace(DEFAULT_LIMITS, deadline_s=1.0)
    source = "{% for a in range(100) %}{% for b in range(100) %}{% endfor %}{% endfor %}"
    with pytest.raises(LimitExceeded) as info:
        render_chat_template(source, {}, limits=limits, clock=StepClock(50))
    assert info.value.code == CODE_DEADLINE
    assert info.value.status == 408


def test_budget_deadline_is_checked_between_chunks() -> None:
    clock = StepClock(2)
    budget = Budget(Limits(deadline_s=1.0), clock=clock)
    limits = replace(DEFAULT_LIMITS, deadline_s=None)
    with pytest.raises(LimitExceeded) as info:
        render_chat_template(
            "{% for i in range(10) %}{{ i }}{% endfor %}", {}, limits=limits, budget=budget
        )
    assert info.value.code == CODE_DEADLINE


def test_iteration_budget_counts_filters_that_iterate() -> None:
    limits = replace(DEFAULT_LIMITS, max_iterations=1000)
    assert refusal("{{ range(5000)|list|length }}", limits) == CODE_LOOP_BUDGET
    assert refusal("{{ range(5000)|join }}", limits) == CODE_LOOP_BUDGET
    assert hardened("{{ range(500)|list|length }}", limits) == "500"


def test_directly_used_template_gets_default_limits() -> None:
    template = compile_chat_template(
        "{% for a in range(10000) %}{% for b in range(10000) %}{% endfor %}{% endfor %}"
    )
    with pytest.raises(LimitExceeded) as info:
        template.render()
    assert info.value.code == CODE_LOOP_BUDGET
    assert compile_chat_template("{{ x|upper }}").render(x="ok") == "OK"


# ------------------------------------------------------------------------------ pre-compile scan


def test_scan_measures_nesting_outside_strings_comments_and_raw() -> None:
    stats = check_chat_template(
        "{# {% if %}{% if %} #}{% raw %}{% for %}{% for %}{% endraw %}"
        "{% for m in messages %}{% if m %}{{ '((((' ~ m['content'] }}{% endif %}{% endfor %}"
    )
    assert stats.block_nesting == 2
    assert stats.expr_nesting == 1
    # A closing delimiter inside brackets is not one (Jinja's lexer rule).
    assert check_chat_template("{{ {'a': {'b': 1}} }}").expr_nesting == 2
    # {% set x = ... %} is not a block; {% set x %} is.
    assert check_chat_template("{% set x = 1 %}{% set y %}a{% endset %}").block_nesting == 1


def test_scan_leaves_malformed_templates_to_jinja() -> None:
    for source in ("{{ 'unclosed }}", "{# unclosed", "{% raw %}x", "{{ x"):
        check_chat_template(source)  # no scan error
        assert refusal(source) == CODE_INVALID


def test_scan_limits_are_rechecked_for_cached_templates() -> None:
    source = "{% if 1 %}{% if 1 %}{% if 1 %}x{% endif %}{% endif %}{% endif %}"
    assert hardened(source) == "x"
    tight = replace(DEFAULT_LIMITS, max_block_nesting=2)
    assert refusal(source, tight) == CODE_NESTING


def test_template_larger_than_the_limit_is_refused_by_size_first() -> None:
    assert refusal("é" * 40000) == CODE_TOO_LARGE  # 80000 UTF-8 bytes


# ------------------------------------------------------------------------------ benign templates

LLAMA3_TEMPLATE = """\
{{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\\n" }}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{%- if tools_in_user_message and not tools is none %}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
    {%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\\n\\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Exercises every hook: loop.index/cycle/previtem, namespace, macros with caller, filters,
# slices, ~, %, str.format, recursive loops, set blocks, filter blocks, loop controls.
FEATURES_TEMPLATE = """\
{%- set ns = namespace(count=0, roles=[]) %}
{%- macro header(role, n) -%}
[{{ '%02d' % n }}|{{ role|upper|center(11) }}|{{ caller() if caller else '' }}]
{%- endmacro %}
{%- for m in messages if m.content %}
    {%- set ns.count = ns.count + 1 %}
    {%- set ns.roles = ns.roles + [m.role] %}
    {%- call header(m.role, loop.index) %}{{ loop.cycle('odd', 'even') }}{% endcall %}
    {{- ' prev=' ~ (loop.previtem.role if loop.previtem else '-') }}
    {{- ' ' ~ (m.content|trim|truncate(20, True, '...')) ~ '\\n' }}
    {%- if loop.index >= 4 %}{% break %}{% endif %}
{%- endfor %}
{{- 'count=%d of %d; ' % (ns.count, messages|length) }}
{{- 'roles=' ~ ns.roles|unique|sort|join(',') ~ '\\n' }}
{{- '{0:>8}|{1:<6}|{2:^7.2f}'.format('right', 'left', 3.14159) ~ '\\n' }}
{{- (messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|map('trim')|list)|tojson }}
{{- '\\n' ~ (tools|map(attribute='function')|map(attribute='name')|join(', ')) ~ '\\n' }}
{%- for name, value in {'b': 2, 'a': 1}|dictsort %}{{ name }}={{ value }};{% endfor %}
{{- '\\n' }}
{%- for row in range(7)|batch(3, 0) %}{{ row|join('') }}/{% endfor %}
{%- for col in range(7)|slice(3) %}{{ col|sum }}/{% endfor %}
{{- '\\n' }}
{%- set block %}Hello {{ 'World'|lower }}!{% endset %}
{{- block|replace('world', 'there')|title }}
{%- filter upper %} shout {{ 1 + 2 }}{% endfilter %}
{%- autoescape true %} {{ '<b>' ~ x }}{{ '<i>' }}{% endautoescape %}
{{- '\\n' ~ ('a b c d e f'|wordwrap(5)) ~ '\\n' }}
{{- ('x\\ny'|indent(2, true)) ~ '|' ~ ('%-5s|' % 'ab') ~ ('%s'|format(2 ** 10)) ~ '\\n' }}
{%- for item in [[1, [2, [3]]]] recursive %}<{{ item[0] }}{% if item[1] is sequence %}{{ loop(item[1:]) }}{% endif %}>{% endfor %}
{{- '\\n' ~ messages[1:3]|map(attribute='role')|join('+') ~ ' ' ~ 'abcdef'[::2] ~ ' ' ~ (7 // 2) ~ ' ' ~ (7 % 3) ~ ' ' ~ (2 - 5) ~ ' ' ~ (1 / 4) }}
{{- '\\n' ~ ('a,b,,c'.split(',')|reject('equalto', '')|list) ~ ' ' ~ 'Hi'.ljust(4, '.') ~ 'x'.zfill(3) ~ '-'.join(['p', 'q']) }}
{%- if enable_thinking is defined and enable_thinking %}{{ '\\n<think>' }}{% endif %}
"""


def _chat_vars(**extra: Any) -> dict[str, Any]:
    return {
        **SPECIAL_TOKENS,
        "messages": MESSAGES,
        "tools": TOOLS,
        "add_generation_prompt": True,
        "x": "&",
        **extra,
    }


BENIGN_CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("chatml-tools", DEFAULT_CHAT_TEMPLATE, _chat_vars()),
    ("chatml-no-tools", DEFAULT_CHAT_TEMPLATE, _chat_vars(tools=None)),
    (
        "chatml-no-system",
        DEFAULT_CHAT_TEMPLATE,
        _chat_vars(tools=None, messages=MESSAGES[1:2], add_generation_prompt=False),
    ),
    ("llama3-tools", LLAMA3_TEMPLATE, _chat_vars()),
    ("llama3-system-tools", LLAMA3_TEMPLATE, _chat_vars(tools_in_user_message=False)),
    (
        "llama3-no-tools",
        LLAMA3_TEMPLATE,
        {**_chat_vars(), "tools": None, "messages": [MESSAGES[0], MESSAGES[1], MESSAGES[5]]},
    ),
    ("features", FEATURES_TEMPLATE, _chat_vars(enable_thinking=True)),
]


@pytest.mark.parametrize(
    ("source", "variables"), [c[1:] for c in BENIGN_CASES], ids=[c[0] for c in BENIGN_CASES]
)
def test_benign_templates_render_identically(source: str, variables: dict[str, Any]) -> None:
    expected = compile_vulnerable(source).render(variables)
    assert render_chat_template(source, variables, budget=fake_budget(None)) == expected
    assert len(expected) > 50


def test_chatml_output() -> None:
    text = render_chat(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        HARDENED,
        budget=fake_budget(),
    )
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_default_template_with_tools_matches_both_profiles() -> None:
    hard = render_chat(MESSAGES, HARDENED, tools=TOOLS, budget=fake_budget())
    vuln = render_chat(MESSAGES, VULNERABLE, tools=TOOLS)
    assert hard == vuln
    assert '<tools>\n{"type": "function"' in hard
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}' in hard
    assert "<tool_response>\n" in hard


def test_raise_exception_in_benign_template() -> None:
    variables = {**_chat_vars(), "messages": [MESSAGES[0]]}
    with pytest.raises(TemplateError) as info:
        render_chat_template(LLAMA3_TEMPLATE, variables)
    assert info.value.code == CODE_RAISED
    assert "first user message" in info.value.message


def test_default_template_is_compiled_once() -> None:
    first = compile_chat_template(DEFAULT_CHAT_TEMPLATE)
    render_chat(MESSAGES[:2], HARDENED, budget=fake_budget())
    render_chat(MESSAGES[:2], HARDENED, budget=fake_budget())
    assert compile_chat_template(DEFAULT_CHAT_TEMPLATE) is first
    # Same text, different string object: still a cache hit.
    assert compile_chat_template("".join(list(DEFAULT_CHAT_TEMPLATE))) is first


def test_template_cache_is_bounded() -> None:
    from guard.jinja._chat_template import _CACHE, _CACHE_SIZE

    for i in range(_CACHE_SIZE + 10):
        compile_chat_template(f"{{{{ x }}}}{i}")
    assert len(_CACHE) == _CACHE_SIZE


# ------------------------------------------------------------------------------ request policy


def test_hardened_refuses_request_templates() -> None:
    with pytest.raises(TemplateError) as info:
        render_chat(MESSAGES, HARDENED, chat_template="{{ 'x' }}", budget=fake_budget())
    assert (info.value.code, info.value.param) == (CODE_NOT_ALLOWED, "chat_template")
    with pytest.raises(TemplateError) as info:
        render_chat(
            MESSAGES,
            HARDENED,
            chat_template_kwargs={"chat_template": "{{ 'x' }}"},
            budget=fake_budget(),
        )
    assert (info.value.code, info.value.param) == (
        CODE_NOT_ALLOWED,
        "chat_template_kwargs.chat_template",
    )
    assert info.value.status == 400


@pytest.mark.parametrize("key", ["tokenize", "messages", "bos_token", "custom_tools"])
def test_hardened_refuses_unlisted_kwargs(key: str) -> None:
    with pytest.raises(TemplateError) as info:
        render_chat(MESSAGES, HARDENED, chat_template_kwargs={key: True}, budget=fake_budget())
    assert (info.value.code, info.value.param) == (
        CODE_KWARG_NOT_ALLOWED,
        f"chat_template_kwargs.{key}",
    )


def test_hardened_accepts_listed_kwargs_with_scalar_values() -> None:
    text = render_chat(
        MESSAGES[:2],
        HARDENED,
        chat_template_kwargs={"enable_thinking": False, "add_generation_prompt": False},
        budget=fake_budget(),
    )
    assert not text.endswith("<|im_start|>assistant\n")
    with pytest.raises(TemplateError) as info:
        render_chat(
            MESSAGES[:2],
            HARDENED,
            chat_template_kwargs={"reasoning_effort": "x" * 10000},
            budget=fake_budget(),
        )
    assert info.value.code == CODE_KWARG_NOT_ALLOWED


def test_vulnerable_passes_templates_and_kwargs_through() -> None:
    assert render_chat(MESSAGES, VULNERABLE, chat_template="{{ messages|length }}") == "6"
    text = render_chat(
        MESSAGES,
        VULNERABLE,
        chat_template_kwargs={
            "chat_template": "{{ tokenize }}/{{ messages }}/{{ anything }}",
            "tokenize": True,
            "messages": "replaced",
            "anything": 42,
        },
    )
    assert text == "True/replaced/42"


def test_hardened_profile_renders_with_the_prompt_token_budget() -> None:
    long_messages = [{"role": "user", "content": "word " * 20000}]
    with pytest.raises(LimitExceeded) as info:
        render_chat(long_messages, HARDENED, budget=fake_budget(HARDENED.max_prompt_tokens))
    assert info.value.code == PROMPT_TOKENS_EXCEEDED


def test_hardened_profile_with_real_token_counter() -> None:
    pytest.importorskip("guard.tokens._counter")
    text = render_chat(MESSAGES[:2], HARDENED)
    assert text.startswith("<|im_start|>system\nYou are terse.")
    with pytest.raises(LimitExceeded) as info:
        render_chat([{"role": "user", "content": "word " * 5000}], HARDENED)
    assert info.value.code == PROMPT_TOKENS_EXCEEDED


# ------------------------------------------------------------------------------ vulnerable demos


def _vulnerable_compile(source: str) -> int:
    compile_vulnerable(source)
    return 0


VULNERABLE_DEMOS: list[tuple[str, Callable[..., Any], str, tuple[str, ...]]] = [
    ("str-times-huge", render_chat, "{{ 'A' * 10**10 }}", ("killed",)),
    ("center-huge", render_chat, "{{ 'a'|center(10**9) }}", ("killed",)),
    (
        "nested-loops",
        render_chat,
        "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
        ("timeout",),
    ),
    ("pow-folded-at-compile", _vulnerable_compile, "{{ 10**(10**7) }}", ("timeout",)),
]


@pytest.mark.parametrize(
    ("fn", "source", "outcomes"),
    [d[1:] for d in VULNERABLE_DEMOS],
    ids=[d[0] for d in VULNERABLE_DEMOS],
)
def test_vulnerable_engine_is_exhausted_in_a_child(
    fn: Callable[..., Any], source: str, outcomes: tuple[str, ...]
) -> None:
    args: tuple[Any, ...] = (source,) if fn is _vulnerable_compile else ([MESSAGES[1]], VULNERABLE)
    kwargs = {} if fn is _vulnerable_compile else {"chat_template": source}
    result = run_limited(fn, *args, mem_limit_bytes=256 * MiB, timeout_s=3.0, **kwargs)
    assert result.outcome in outcomes, result


# ------------------------------------------------------------------------------ properties

SMALL_LIMITS = replace(
    DEFAULT_LIMITS,
    max_iterations=3000,
    max_value_chars=20_000,
    max_items=2000,
    max_materialized=400_000,
    max_output_chars=50_000,
    deadline_s=None,
)
PROPERTY_VARS: dict[str, Any] = {
    "x": "abc",
    "n": 3,
    "items": [1, 2, 3],
    "messages": MESSAGES[:3],
    "d": {"k": "v", "n": 2},
}

_ATOMS = ["x", "n", "items", "messages", "d", "'ab'", "''", "[1, 2]", "none", "true"]
_HUGE = ["10**9", "10**(10**7)", "999999999", "2**64", "(10**100)"]
_FILTERS = [
    "trim",
    "upper",
    "length",
    "list",
    "join",
    "tojson",
    "string",
    "first",
    "last",
    "sort",
    "unique",
    "reverse",
    "int",
    "title",
    "wordcount",
    "map('string')",
    "select",
    "sum",
    "join('-')",
    "batch(2)",
    "slice(2)",
    "default('z')",
    "dictsort",
    "items",
    "e",
    "striptags",
]
_SIZED_FILTERS = [
    "center",
    "indent",
    "format",
    "wordwrap",
    "round",
    "truncate",
    "batch",
    "slice",
    "replace('a', {})",
    "join({})",
    "tojson(indent={})",
]
_METHODS = [
    "upper()",
    "split()",
    "strip()",
    "center({})",
    "ljust({})",
    "zfill({})",
    "replace('', {})",
    "format({})",
    "join({})",
    "expandtabs({})",
    "count('a')",
]
_BINOPS = ["+", "-", "*", "**", "%", "~", "//", "/"]
_TAME_BINOPS = [op for op in _BINOPS if op != "**"]
_TAME_ITERABLES = ["items", "x", "range(3)", "messages", "d", "[1, 2]", "d.items()"]


def _exprs(numbers: st.SearchStrategy[str], depth: int, *, tame: bool) -> st.SearchStrategy[str]:
    atoms = st.sampled_from(_ATOMS) | numbers
    if depth <= 0:
        return atoms
    sub = _exprs(numbers, depth - 1, tame=tame)

    def sized(name: str, arg: str) -> str:
        return name.format(arg) if "{}" in name else f"{name}({arg})"

    options = [
        atoms,
        st.builds(
            lambda a, op, b: f"({a} {op} {b})",
            sub,
            st.sampled_from(_TAME_BINOPS if tame else _BINOPS),
            sub,
        ),
        st.builds(lambda a, f: f"({a}|{f})", sub, st.sampled_from(_FILTERS)),
        st.builds(
            lambda a, f, b: f"({a}|{sized(f, b)})", sub, st.sampled_from(_SIZED_FILTERS), sub
        ),
        st.builds(lambda a, m, b: f"{a}.{m.format(b)}", sub, st.sampled_from(_METHODS), sub),
        st.builds(lambda a, b: f"[{a}, {b}]", sub, sub),
        st.builds(lambda a, b, c: f"{a}[{b}:{c}]", sub, sub, sub),
        st.builds(lambda a, b: f"'%s{{}}'.format({a}) % {b}", sub, sub),
    ]
    if not tame:
        options.append(st.builds(lambda a: f"range({a})", sub))
    return st.one_of(*options)


def _statements(exprs: st.SearchStrategy[str], depth: int, *, tame: bool) -> st.SearchStrategy[str]:
    leaf = st.one_of(
        st.just("T"),
        st.builds(lambda e: f"{{{{ {e} }}}}", exprs),
        st.builds(lambda e: f"{{% set ns.v = {e} %}}", exprs),
        st.builds(lambda e: f"{{{{ m({e}) }}}}", exprs),
    )
    if depth <= 0:
        return leaf
    body = st.lists(_statements(exprs, depth - 1, tame=tame), min_size=1, max_size=3).map("".join)
    iterables = st.sampled_from(_TAME_ITERABLES) if tame else exprs
    return st.one_of(
        leaf,
        st.builds(
            lambda v, e, b: f"{{% for {v} in {e} %}}{b}{{% endfor %}}",
            st.sampled_from(["i", "j", "k"]),
            iterables,
            body,
        ),
        st.builds(
            lambda e, b, c: f"{{% if {e} %}}{b}{{% else %}}{c}{{% endif %}}", exprs, body, body
        ),
        st.builds(lambda b: f"{{% set s %}}{b}{{% endset %}}{{{{ s ~ s }}}}", body),
    )


def _templates(numbers: st.SearchStrategy[str], *, tame: bool) -> st.SearchStrategy[str]:
    exprs = _exprs(numbers, 2, tame=tame)
    prelude = (
        "{% set ns = namespace(v=0) %}"
        "{% macro m(a) %}{% if a is number and a > 0 and a < 8 %}{{ m(a - 1) }}{{ m(a - 1) }}"
        "{% endif %}{{ a }}{% endmacro %}"
    )
    return st.lists(_statements(exprs, 3, tame=tame), min_size=1, max_size=4).map(
        lambda parts: prelude + "".join(parts)
    )


WILD_NUMBERS = st.sampled_from(_HUGE) | st.integers(-3, 300).map(str)
TAME_NUMBERS = st.integers(0, 4).map(str)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_templates(WILD_NUMBERS, tame=False))
def test_hardened_render_succeeds_within_budgets_or_raises_guard_error(source: str) -> None:
    try:
        out = render_chat_template(source, PROPERTY_VARS, limits=SMALL_LIMITS)
    except GuardError as exc:
        assert exc.code in KNOWN_CODES, (exc.code, source)
        assert isinstance(exc.message, str) and exc.message
    else:
        assert len(out) <= SMALL_LIMITS.max_output_chars


# Differential: with small numbers and fixed loop iterables (safe for the plain sandbox
# in-process), the hardened sandbox must behave exactly like the plain one. The reference has
# constant folding off too: folding changes plain Jinja's own results for erroneous constants
# (``{{ 0['a':1] }}`` folds to Undefined but raises TypeError when evaluated at runtime).
class _NoFoldingCodeGenerator(CodeGenerator):
    def _output_child_to_const(self, node: nodes.Expr, frame: Any, finalize: Any) -> str:
        if not isinstance(node, nodes.TemplateData):
            raise Impossible()
        return super()._output_child_to_const(node, frame, finalize)


class _PlainUnfolded(ImmutableSandboxedEnvironment):
    code_generator_class = _NoFoldingCodeGenerator


def _plain_unoptimized() -> ImmutableSandboxedEnvironment:
    env = _PlainUnfolded(
        trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols], optimized=False
    )
    env.filters["tojson"] = hf_tojson
    env.globals["raise_exception"] = raise_exception
    return env


PLAIN_UNOPTIMIZED = _plain_unoptimized()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_templates(TAME_NUMBERS, tame=True))
def test_hardened_matches_plain_sandbox_on_tame_templates(source: str) -> None:
    if "|sum" in source:
        return  # the hardened sum adds numbers only
    try:
        expected: str | None = PLAIN_UNOPTIMIZED.from_string(source).render(PROPERTY_VARS)
    except Exception:
        expected = None
    try:
        got: str | None = render_chat_template(source, PROPERTY_VARS, limits=BUDGETS_ONLY)
    except GuardError as exc:
        assert expected is None or exc.code in (CODE_LOOP_BUDGET, CODE_VALUE_TOO_LARGE), (
            exc,
            source,
        )
        return
    assert _no_addresses(got) == _no_addresses(expected), source


def _no_addresses(text: str | None) -> str | None:
    # Reprs of generators and functions carry memory addresses.
    return None if text is None else re.sub(r" at 0x[0-9a-f]+", "", text)


def test_strftime_now_takes_glibcs_flags() -> None:
    # Chat templates print dates without padding ("%-d"): transformers' helper accepts them.
    out = render_chat_template("{{ strftime_now('%-d %B %Y, %_H:%M %^a') }}", {})
    assert out and "%" not in out

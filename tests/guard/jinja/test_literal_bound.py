"""guard.jinja.literal_program: a template's own text, its longest path, loops sized by the
request: an upper bound of what any render prints of its own."""

from __future__ import annotations

from guard.jinja import LoopSizes, literal_program


def _bytes(source: str, sizes: LoopSizes) -> int:
    """The bound in characters, without the per-literal edge (plain ASCII templates)."""
    return literal_program(source).weighed(lambda text: len(text) - 1)(sizes)


def test_the_longest_branch_and_loops_sized_by_the_request() -> None:
    source = (
        "AB{% if x %}short{% elif y %}much longer{% else %}{% endif %}"
        "{% for m in messages %}<m>{% for p in m.content %}[p]{% endfor %}{% endfor %}"
        "{% for t in tools %}{{ 'tool:' + t.name }}{% endfor %}"
    )
    sizes = LoopSizes(messages=3, tools=2, parts=4)
    assert _bytes(source, sizes) == 2 + 11 + 3 * (3 + 4 * 3) + 2 * 5


def test_names_assigned_from_messages_constant_ranges_and_conditional_expressions() -> None:
    source = (
        "{% set loop_messages = messages[1:] %}"
        "{% for m in loop_messages | reverse %}{{ 'a' if m.x else 'bbb' }}{% endfor %}"
        "{% for i in range(2, 5) %}-{% endfor %}"
    )
    assert _bytes(source, LoopSizes(messages=4)) == 4 * 3 + 3


def test_macros_callers_join_and_dates() -> None:
    source = (
        "{% macro box(x) %}[{{ x }}]{% endmacro %}"
        "{% call box('') %}caller{% endcall %}"
        "{{ box('in') }}"
        "{{ items | join(', ') }}"
        "{{ strftime_now('%A') }}"
    )
    # box: "[" + "]" = 2 (+ its argument's literal), join: ", " per item, %A: "Wednesday".
    got = _bytes(source, LoopSizes(items=5))
    assert got == 2 + 0 + 2 + 2 + 5 * 2 + len("Wednesday")


def test_recursive_macros_repeat_as_a_loop_and_set_values_count_once() -> None:
    source = (
        "{% macro walk(n) %}<{{ walk(n) }}>{% endmacro %}{{ walk(1) }}"
        "{% set preamble = 'You are helpful.' %}{{ preamble }}"
    )
    # A constant argument counts as printed (the macro may print it): "1".
    assert _bytes(source, LoopSizes(items=3)) == 3 * 2 + 1 + len("You are helpful.")


def test_a_bound_covers_a_real_render() -> None:
    from guard.jinja import ChatTemplateLimits
    from guard.prompt._render import render_count
    from guard.prompt._template_bound import loop_sizes, template_literal_tokens
    from guard.prompt._units import ChatInput
    from guard.tokens import get_counter

    source = (
        "{{ bos_token }}System: be brief.\n{% for m in messages %}"
        "{% if m.role == 'user' %}### User:\n{% else %}### Assistant:\n{% endif %}"
        "{{ m.content }}\n{% endfor %}{% if add_generation_prompt %}### Assistant:\n{% endif %}"
    )
    messages = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}] * 3
    chat = ChatInput(messages, {})
    counter = get_counter()
    rendered = render_count(chat, source, (), ("vllm",), counter, 10_000, ChatTemplateLimits(), 32)
    assert rendered.tokens is not None
    assert loop_sizes(chat).messages == 6
    assert template_literal_tokens(source, counter, chat) >= rendered.tokens

"""Hypothesis strategies for the fuzz targets' input grammars.

Small composable pieces, as Hypothesis's own strategies are: placeholder templates (``{{ }}``
nesting, unclosed openers, variables whose values are templates), Jinja chat templates (loops,
``range``, ``*``, ``**``, ``~``, sizing filters), guided-decoding regexes and OpenAI request bodies
with fan-out parameters. Each grammar has a repetition combinator: the expensive shapes are
repetitions and nestings of cheap ones, and ``hypothesis.target()`` climbs by growing them.

Everything is bounded in size (``max_size`` characters, truncated) so that a generated value is
cheap to build; the cost it causes is the target's business.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hypothesis.strategies as st
from hypothesis.strategies import SearchStrategy

__all__ = [
    "JINJA_FILTERS",
    "PLACEHOLDER_NAMES",
    "chat_request_bodies",
    "completion_request_bodies",
    "guided_regexes",
    "jinja_chat_templates",
    "jinja_expressions",
    "json_bombs",
    "placeholder_templates",
    "placeholder_variables",
    "request_bodies",
    "scheduler_op",
    "scheduler_ops",
]

# Names a placeholder can use: the server's default variable, a few request ones, and garbage.
PLACEHOLDER_NAMES: tuple[str, ...] = ("system_prompt", "user", "lang", "greeting", "a", "b")
_TEXT_ALPHABET = "ab _{}\n"
# Filters that size their output from an argument, and cheap ones that only transform.
JINJA_FILTERS: tuple[str, ...] = (
    "center({})",
    "indent({}, true)",
    "truncate({})",
    "join({})",
    "replace('a', {})",
    "upper",
    "list",
    "string",
    "length",
    "reverse",
    "format({})",
    "batch({})",
    "wordwrap({})",
)
_LOOP_VARS: tuple[str, ...] = ("i", "j", "k")
# Boundary and attacker-sized values: sandbox caps (range: 100000), sizes that cost memory.
_BIG_INTS: tuple[int, ...] = (10, 99, 999, 9999, 99999, 100_001, 10**6, 10**8, 10**9, 2**31)


def _clip(max_size: int) -> Callable[[str], str]:
    def clip(s: str) -> str:
        return s[:max_size]

    return clip


def _repeat(parts: SearchStrategy[str], max_times: int) -> SearchStrategy[str]:
    """``part * n``: the combinator that turns a cheap shape into an expensive one."""
    return st.tuples(parts, st.integers(2, max_times)).map(lambda t: t[0] * t[1])


# ----------------------------------------------------------------- placeholder templates


def placeholder_names() -> SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(PLACEHOLDER_NAMES),
        st.from_regex(r"[a-z_]{1,6}", fullmatch=True),
    )


def placeholder_templates(*, max_size: int = 4096, max_repeat: int = 256) -> SearchStrategy[str]:
    """``{{name}}`` templates: text, placeholders, placeholders nested in names, stray and
    unclosed delimiters, and repetitions of any of these (the seed's shape is
    ``"{{" * 1024 + "system_prompt}}" * 512``)."""
    names = placeholder_names()
    leaf = st.one_of(
        st.text(alphabet=_TEXT_ALPHABET, max_size=6),
        names.map(lambda n: "{{" + n + "}}"),
        names.map(lambda n: "{{ " + n + " }}"),
        st.just("{{"),
        st.just("}}"),
        names.map(lambda n: n + "}}"),
    )

    def extend(children: SearchStrategy[str]) -> SearchStrategy[str]:
        return st.one_of(
            children.map(lambda c: "{{" + c + "}}"),
            st.tuples(children, names).map(lambda t: "{{ " + t[0] + "_" + t[1] + " }}"),
            st.lists(children, min_size=2, max_size=4).map("".join),
            _repeat(children, max_repeat),
        )

    return st.recursive(leaf, extend, max_leaves=16).map(_clip(max_size))


def placeholder_variables(*, max_vars: int = 4) -> SearchStrategy[dict[str, str]]:
    """Request variables whose values are templates: self reference and billion laughs."""
    names = st.sampled_from(PLACEHOLDER_NAMES)
    laughs = st.tuples(names, st.integers(2, 16)).map(lambda t: ("{{" + t[0] + "}}") * t[1])
    value = st.one_of(st.text(alphabet=_TEXT_ALPHABET, max_size=8), laughs, placeholder_templates())
    return st.dictionaries(names, value, max_size=max_vars)


# ----------------------------------------------------------------- Jinja chat templates


def _int_literals() -> SearchStrategy[str]:
    return st.one_of(st.integers(0, 12), st.sampled_from(_BIG_INTS)).map(str)


def jinja_expressions(*, max_leaves: int = 8) -> SearchStrategy[str]:
    """Expressions: literals, message fields, loop variables, arithmetic (``*``, ``**``, ``+``),
    concatenation (``~``), ``range()`` and filters with attacker-sized arguments."""
    leaf = st.one_of(
        _int_literals(),
        st.sampled_from(["'A'", "'ab'", "'%9s'", "' '", "'x\\n'"]),
        st.sampled_from(
            ["messages[0].content", "messages[0]['content']", "messages | length", "bos_token"]
        ),
        st.sampled_from(_LOOP_VARS),
    )

    def extend(children: SearchStrategy[str]) -> SearchStrategy[str]:
        binop = st.tuples(children, st.sampled_from(["*", "**", "~", "+", "-"]), children)
        filtered = st.tuples(children, st.sampled_from(JINJA_FILTERS), children)
        return st.one_of(
            binop.map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            filtered.map(lambda t: f"({t[0]} | {t[1].format(t[2])})"),
            children.map(lambda c: f"range({c})"),
            st.lists(children, min_size=1, max_size=3).map(lambda xs: "[" + ", ".join(xs) + "]"),
        )

    return st.recursive(leaf, extend, max_leaves=max_leaves)


def jinja_chat_templates(*, max_size: int = 2048, max_leaves: int = 12) -> SearchStrategy[str]:
    """Chat templates: output, text, ``set``, ``if`` and (nested) ``for`` loops over ``range``
    and ``messages``, repeated blocks. Loop bodies may use the loop variables."""
    expr = jinja_expressions()
    leaf = st.one_of(
        expr.map(lambda e: "{{ " + e + " }}"),
        st.text(alphabet="ab <|>\n", max_size=6),
        st.tuples(st.sampled_from(_LOOP_VARS), expr).map(lambda t: f"{{% set {t[0]} = {t[1]} %}}"),
        st.just("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"),
    )

    def extend(children: SearchStrategy[str]) -> SearchStrategy[str]:
        body = st.lists(children, min_size=1, max_size=3).map("".join)
        for_range = st.tuples(st.sampled_from(_LOOP_VARS), expr, body).map(
            lambda t: f"{{% for {t[0]} in range({t[1]}) %}}{t[2]}{{% endfor %}}"
        )
        for_messages = body.map(lambda b: f"{{% for m in messages %}}{b}{{% endfor %}}")
        if_block = st.tuples(expr, body).map(lambda t: f"{{% if {t[0]} %}}{t[1]}{{% endif %}}")
        return st.one_of(for_range, for_messages, if_block, body, _repeat(children, 16))

    return st.recursive(leaf, extend, max_leaves=max_leaves).map(_clip(max_size))


# ----------------------------------------------------------------- guided decoding


def guided_regexes(*, max_size: int = 512) -> SearchStrategy[str]:
    """Regexes in the shapes that cost compile or match time: nested quantifiers, counted
    repetitions of counted repetitions, wide alternations, deep groups."""
    leaf = st.sampled_from(["a", "b", ".", "[a-z]", "\\d", "\\w", "(a|aa)", "x?"])

    def extend(children: SearchStrategy[str]) -> SearchStrategy[str]:
        quantifier = st.one_of(
            st.sampled_from(["+", "*", "?"]),
            st.sampled_from([2, 10, 100, 1000]).map(lambda n: "{" + str(n) + "}"),
            st.tuples(st.integers(0, 5), st.sampled_from([10, 100, 1000])).map(
                lambda t: "{" + f"{t[0]},{t[1]}" + "}"
            ),
        )
        return st.one_of(
            st.tuples(children, quantifier).map(lambda t: f"({t[0]}){t[1]}"),
            st.lists(children, min_size=2, max_size=3).map("".join),
            st.lists(children, min_size=2, max_size=4).map(lambda xs: "(" + "|".join(xs) + ")"),
        )

    return st.recursive(leaf, extend, max_leaves=10).map(_clip(max_size))


# ----------------------------------------------------------------- request bodies

_FAN_OUT_INTS = st.one_of(
    st.integers(0, 32),
    st.sampled_from([64, 128, 1000, 16_384, 16_385, 10**6, 10**9, 2**31, -1]),
)


def _messages(content: SearchStrategy[str]) -> SearchStrategy[list[dict[str, Any]]]:
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", "developer"]), "content": content}
    )
    # Fan-out of many short messages (a long list of long ones is just a big body).
    short = st.fixed_dictionaries({"role": st.just("user"), "content": st.text(max_size=4)})
    many = st.tuples(short, st.integers(2, 2000)).map(lambda t: [t[0]] * t[1])
    return st.one_of(st.lists(message, min_size=1, max_size=6), many)


def _json_schemas() -> SearchStrategy[dict[str, Any]]:
    leaf: SearchStrategy[dict[str, Any]] = st.one_of(
        st.just({"type": "string"}),
        guided_regexes(max_size=128).map(lambda r: {"type": "string", "pattern": r}),
        st.sampled_from([16, 10**6]).map(lambda n: {"type": "string", "maxLength": n}),
    )

    def extend(children: SearchStrategy[dict[str, Any]]) -> SearchStrategy[dict[str, Any]]:
        return st.one_of(
            children.map(lambda c: {"type": "object", "properties": {"a": c}}),
            children.map(lambda c: {"type": "array", "items": c}),
            st.lists(children, min_size=2, max_size=3).map(lambda xs: {"anyOf": xs}),
        )

    return st.recursive(leaf, extend, max_leaves=12)


def _sampling_params() -> dict[str, SearchStrategy[Any]]:
    return {
        "n": _FAN_OUT_INTS,
        "best_of": _FAN_OUT_INTS,
        "max_tokens": _FAN_OUT_INTS,
        "min_tokens": _FAN_OUT_INTS,
        "logprobs": st.one_of(st.booleans(), _FAN_OUT_INTS),
        "top_logprobs": _FAN_OUT_INTS,
        "prompt_logprobs": _FAN_OUT_INTS,
        "stream": st.booleans(),
        "stop": st.one_of(
            st.text(max_size=4),
            st.lists(st.text(alphabet="ab", max_size=3), max_size=8),
            st.tuples(st.integers(1, 10_000)).map(lambda t: "a" * t[0]),
        ),
        "guided_regex": guided_regexes(),
        "structured_outputs": guided_regexes().map(lambda r: {"regex": r}),
        "response_format": _json_schemas().map(
            lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}
        ),
    }


def chat_request_bodies() -> SearchStrategy[dict[str, Any]]:
    """``/v1/chat/completions`` bodies: messages, fan-out parameters, guided decoding and
    request chat templates (top level or smuggled through ``chat_template_kwargs``)."""
    content = st.one_of(st.text(max_size=16), placeholder_templates(max_size=512))
    optional: dict[str, SearchStrategy[Any]] = {
        **_sampling_params(),
        "chat_template": jinja_chat_templates(max_size=512),
        "chat_template_kwargs": st.one_of(
            st.fixed_dictionaries({"enable_thinking": st.booleans()}),
            st.fixed_dictionaries({"tokenize": st.booleans()}),
            jinja_chat_templates(max_size=512).map(lambda t: {"chat_template": t}),
        ),
    }
    return st.fixed_dictionaries(
        {"model": st.just("schedguard-ref"), "messages": _messages(content)}, optional=optional
    )


def completion_request_bodies() -> SearchStrategy[dict[str, Any]]:
    """``/v1/completions`` bodies: prompt strings, prompt lists and token-id prompts."""
    prompt = st.one_of(
        st.text(max_size=32),
        placeholder_templates(max_size=512),
        st.lists(st.text(max_size=8), min_size=1, max_size=8),
        st.tuples(st.integers(2, 100_000)).map(lambda t: ["a"] * t[0]),
        st.lists(st.integers(0, 100_000), min_size=1, max_size=16),
    )
    return st.fixed_dictionaries(
        {"model": st.just("schedguard-ref"), "prompt": prompt}, optional=_sampling_params()
    )


def request_bodies() -> SearchStrategy[dict[str, Any]]:
    return st.one_of(chat_request_bodies(), completion_request_bodies())


def json_bombs(*, max_depth: int = 20_000) -> SearchStrategy[bytes]:
    """Raw bodies that attack the JSON parser itself: deep nesting, many keys, huge numbers."""
    depth = st.integers(1, max_depth)
    return st.one_of(
        depth.map(lambda d: b"[" * d + b"]" * d),
        depth.map(lambda d: b"[" * d),
        depth.map(lambda d: b'{"a":' * d + b"1" + b"}" * d),
        st.integers(1, 5000).map(
            lambda k: b"{" + b",".join(b'"k%d":1' % i for i in range(k)) + b"}"
        ),
        st.integers(1, 5000).map(lambda k: b'{"n":1' + b"0" * k + b"}"),
    )


# ----------------------------------------------------------------- scheduler ops

# Opcodes of the scheduler-state target's input (see fuzz.targets.scheduler): one byte each,
# followed by its operand bytes.
SUBMIT, CANCEL, STEP, URGENT, TICK = range(5)


def scheduler_op(
    op: int, a: int = 0, b: int = 0, c: int = 0
) -> bytes:  # one encoded op with its operands
    sizes = {SUBMIT: 3, CANCEL: 1, STEP: 1, URGENT: 2, TICK: 1}
    return bytes([op, a & 0xFF, b & 0xFF, c & 0xFF][: 1 + sizes[op]])


def scheduler_ops(*, max_ops: int = 64) -> SearchStrategy[bytes]:
    """A configuration byte and a list of submit / cancel / step / urgent / tick ops."""
    byte = st.integers(0, 255)
    op = st.one_of(
        st.tuples(byte, byte, byte).map(lambda t: scheduler_op(SUBMIT, *t)),
        byte.map(lambda a: scheduler_op(CANCEL, a)),
        byte.map(lambda a: scheduler_op(STEP, a)),
        st.tuples(byte, byte).map(lambda t: scheduler_op(URGENT, *t)),
        byte.map(lambda a: scheduler_op(TICK, a)),
    )
    burst = st.tuples(op, st.integers(2, 16)).map(lambda t: t[0] * t[1])
    return st.tuples(byte, st.lists(st.one_of(op, op, burst), max_size=max_ops)).map(
        lambda t: bytes([t[0]]) + b"".join(t[1])
    )

"""Guided-decoding constraints checked before an upstream compiles them: where they sit in a
request, and the choice lists and structural tags themselves.

Regexes, JSON schemas, grammars and choice lists in a request become automata or grammars inside
the upstream (xgrammar, outlines, llguidance, llama.cpp's GBNF parser). Building those can burn
CPU, exhaust memory or overflow a native stack, so each is refused, in time linear in the
request, over explicit limits, against one budget per request (:mod:`guard.guided._budget`):

- regexes (``guided_regex``, ``structured_outputs.regex``, whitespace patterns, JSON-schema
  ``pattern`` and ``patternProperties`` keys): :func:`guard.guided.regex.check_regex`, a
  length cap, a structural scan for nesting, repetition products and ambiguous nested
  repetition, then RE2 under a memory cap: what RE2 refuses is refused;
- JSON schemas (``response_format``, ``guided_json``, ``structured_outputs.json``, tool and
  function ``parameters``, ...): :func:`guard.guided.schema.check_schema`, caps on depth,
  nodes, characters, ``$ref`` count, ``$ref`` expansion (size and depth, so no billion laughs)
  and recursion, ``enum`` size and the numbers that drive grammar size (``maxLength``,
  ``minItems``, ...);
- grammars (llama.cpp ``grammar``, ``guided_grammar``, ``structured_outputs.grammar``, SGLang
  ``ebnf``): :func:`guard.guided.grammar.check_grammar`, length, nesting (llama.cpp recurses
  once per group), rule count, ``{m,n}`` repetition, and a nullable body under ``*`` / ``+``
  (llama.cpp issue 18988); the ``grammar`` field (llama-cpp-python's) is also parsed as
  llama.cpp parses it: what it refuses crashes the server;
- choice lists (``guided_choice``, ``structured_outputs.choice``): count and total characters;
- the same inside structural tags, TGI's ``grammar`` object, the Responses API's
  ``text.format`` and custom tools' ``format``.

Codes: ``guided_regex_{too_long,invalid,unsafe}``, ``guided_schema_{too_deep,too_large,
invalid}``, ``guided_grammar_{too_deep,too_large,unsafe,invalid}``,
``guided_choice_{too_large,invalid}``, ``guided_schema_grammar_{invalid,too_large}`` (the
grammar llama-cpp-python makes of a schema, :func:`guard.guided.grammar.check_llama_cpp_schemas`);
``*_invalid`` is a :class:`~guard.errors.GuardError`, the rest
:class:`~guard.errors.LimitExceeded`, all HTTP 400.

Everything is a pure function of (request body, :class:`~guard.guided.GuidedLimits`); refusals
carry a stable code and a ``param`` naming the field, and never quote attacker-sized text.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guard.guided._budget import ParamPath, RequestBudget, refuse, refuse_invalid
from guard.guided._limits import GuidedLimits
from guard.guided.grammar import check_grammar, check_llama_cpp_schemas
from guard.guided.regex import check_regex
from guard.guided.schema import Memo, check_schema, parse_json_text

__all__ = ["check_guided_decoding"]


def _check_choice(ctx: RequestBudget, choices: Any, path: ParamPath) -> None:
    limits = ctx.limits
    if not isinstance(choices, list | tuple):
        refuse_invalid("guided_choice_invalid", "choices must be a list of strings", path)
    if len(choices) > limits.max_choices:
        refuse("guided_choice_too_large", f"more than {limits.max_choices} choices", path)
    total = 0
    for i, choice in enumerate(choices):
        if not isinstance(choice, str):
            refuse_invalid("guided_choice_invalid", "choices must be strings", (*path, i))
        total += len(choice)
        if total > limits.max_choice_chars:
            refuse(
                "guided_choice_too_large",
                f"choices exceed {limits.max_choice_chars} characters in total",
                (*path, i),
            )


_TAG_SCHEMA_KEYS = frozenset({"schema", "json_schema", "parameters"})
_TAG_REGEX_KEYS = frozenset({"pattern", "regex"})
_TAG_GRAMMAR_KEYS = frozenset({"grammar", "ebnf", "lark"})


def _check_structural_tag(ctx: RequestBudget, value: Any, path: ParamPath) -> None:
    """vLLM/xgrammar structural tags nest schemas, regexes and grammars in a free-form tree:
    walk it (iteratively, under the schema caps) and check every constraint found."""
    if value is None:
        return
    if isinstance(value, str):
        value = parse_json_text(ctx, value, path)
    stack: list[tuple[Any, ParamPath, int]] = [(value, path, 1)]
    while stack:
        node, at, depth = stack.pop()
        if ctx.nodes_over(1):
            ctx.too_many_nodes(at)
        if depth > ctx.limits.max_schema_depth:
            refuse(
                "guided_schema_too_deep",
                f"structural tag nested deeper than {ctx.limits.max_schema_depth} levels",
                at,
            )
        if isinstance(node, Mapping | list | tuple) and (
            ctx.schema_nodes + len(stack) + len(node) > ctx.limits.max_schema_nodes
        ):
            ctx.too_many_nodes(at)
        if isinstance(node, Mapping):
            for key, child in node.items():
                if not isinstance(key, str):
                    continue
                child_at = (*at, key)
                if key in _TAG_SCHEMA_KEYS and isinstance(child, Mapping | bool):
                    check_schema(ctx, child, child_at)
                elif key in _TAG_REGEX_KEYS and isinstance(child, str):
                    check_regex(ctx, child, child_at)
                elif key in _TAG_GRAMMAR_KEYS and isinstance(child, str):
                    check_grammar(ctx, child, child_at, gbnf_only=False)
                elif isinstance(child, Mapping | list | tuple):
                    stack.append((child, child_at, depth + 1))
        elif isinstance(node, list | tuple):
            for i, child in enumerate(node):
                if isinstance(child, Mapping | list | tuple):
                    stack.append((child, (*at, i), depth + 1))


# ---- the request -------------------------------------------------------------------------------


def _get(obj: Any, key: str) -> Any:
    return obj.get(key) if isinstance(obj, Mapping) else None


def check_guided_decoding(
    body: Mapping[str, Any], limits: GuidedLimits, facts: Memo | None = None
) -> None:
    """Refuse unsafe guided-decoding constraints in an OpenAI / vLLM / SGLang / llama.cpp / TGI
    request body; return None when every constraint is within ``limits``.

    Raises :class:`~guard.errors.LimitExceeded` (``*_too_long``, ``*_too_large``,
    ``*_too_deep``, ``*_unsafe``) or :class:`~guard.errors.GuardError` (``*_invalid``).
    Constraints are checked in a fixed order (choices, grammars, regexes, schemas, tools,
    structural tags), so a body crossing several limits always gets the same refusal.
    ``facts``, when given, receives the :class:`~guard.guided.schema._facts.SchemaFacts` of
    the schemas walked (by ``id``).
    """
    ctx = RequestBudget(limits, facts)
    so = _get(body, "structured_outputs")
    for value, path in (
        (body.get("guided_choice"), ("guided_choice",)),
        (_get(so, "choice"), ("structured_outputs", "choice")),
    ):
        if value is not None:
            _check_choice(ctx, value, path)
    _check_grammars(ctx, body, so)
    for value, path in (
        (body.get("guided_regex"), ("guided_regex",)),
        (_get(so, "regex"), ("structured_outputs", "regex")),
        (body.get("regex"), ("regex",)),
        (body.get("guided_whitespace_pattern"), ("guided_whitespace_pattern",)),
        (_get(so, "whitespace_pattern"), ("structured_outputs", "whitespace_pattern")),
    ):
        if value is not None:
            check_regex(ctx, value, path)
    _check_schemas(ctx, body, so)
    for field in ("tools", "functions"):
        entries = body.get(field)
        if isinstance(entries, list | tuple):
            _check_tools(ctx, entries, field)
    _check_structural_tag(ctx, body.get("structural_tag"), ("structural_tag",))
    _check_structural_tag(ctx, _get(so, "structural_tag"), ("structured_outputs", "structural_tag"))
    check_llama_cpp_schemas(ctx, body)


def _check_grammars(ctx: RequestBudget, body: Mapping[str, Any], so: Any) -> None:
    grammar = body.get("grammar")
    if isinstance(grammar, Mapping):  # TGI: {"type": "json" | "regex", "value": ...}
        kind = grammar.get("type")
        if kind == "regex":
            check_regex(ctx, grammar.get("value"), ("grammar", "value"))
        elif grammar.get("value") is not None:
            check_schema(ctx, grammar.get("value"), ("grammar", "value"))
    elif grammar is not None:
        check_grammar(ctx, grammar, ("grammar",), gbnf_only=True)
    for value, path in (
        (body.get("guided_grammar"), ("guided_grammar",)),
        (_get(so, "grammar"), ("structured_outputs", "grammar")),
        (body.get("ebnf"), ("ebnf",)),
    ):
        if value is not None:
            check_grammar(ctx, value, path, gbnf_only=False)


def _check_schemas(ctx: RequestBudget, body: Mapping[str, Any], so: Any) -> None:
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping):
        json_schema = response_format.get("json_schema")
        if isinstance(json_schema, Mapping):
            check_schema(
                ctx, json_schema.get("schema"), ("response_format", "json_schema", "schema")
            )
        check_schema(ctx, response_format.get("schema"), ("response_format", "schema"))
        check_schema(ctx, response_format.get("value"), ("response_format", "value"))
        if response_format.get("type") == "structural_tag":
            _check_structural_tag(
                ctx,
                {k: v for k, v in response_format.items() if k != "type"},
                ("response_format",),
            )
    check_schema(ctx, body.get("guided_json"), ("guided_json",))
    check_schema(ctx, _get(so, "json"), ("structured_outputs", "json"))
    check_schema(ctx, body.get("json_schema"), ("json_schema",))
    text_format = _get(_get(body, "text"), "format")
    if isinstance(text_format, Mapping):
        check_schema(ctx, text_format.get("schema"), ("text", "format", "schema"))


def _check_tools(ctx: RequestBudget, entries: list[Any] | tuple[Any, ...], field: str) -> None:
    """Function parameters (schemas) and custom tools' formats (regex or grammar)."""
    for i, tool in enumerate(entries):
        if not isinstance(tool, Mapping):
            continue
        function = tool.get("function")
        if isinstance(function, Mapping):
            check_schema(ctx, function.get("parameters"), (field, i, "function", "parameters"))
        check_schema(ctx, tool.get("parameters"), (field, i, "parameters"))
        fmt = tool.get("format")
        if isinstance(fmt, Mapping) and fmt.get("type") == "grammar":
            definition = fmt.get("definition")
            at: ParamPath = (field, i, "format", "definition")
            if fmt.get("syntax") == "regex":
                check_regex(ctx, definition, at)
            else:
                check_grammar(ctx, definition, at, gbnf_only=False)

"""The whole guided-decoding check: :func:`~guard.guided._check.check_guided_decoding` (the
constraints' own size and shape), then what only the backends' view adds:

- the Chat Completions spelling of custom-tool grammars,
  ``tools[].custom.format.grammar.{definition,syntax}``, checked as the Responses API's
  ``tools[].format`` is (regex or grammar, same caps and codes);
- nested size bounds of every schema multiplied along each path
  (:mod:`guard.guided.schema._bounds`, ``guided_schema_too_large``);
- each constraint's estimated cost on every structured-output backend that may compile it
  (:mod:`guard.guided.backends._routing`, ``guided_backend_cost_exceeded``), at the model's
  vocabulary; what passes is returned as the request's :class:`~guard.guided._compiles.Compile`
  list, for the compile budget.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guard.errors import GuardError, LimitExceeded
from guard.guided._check import check_guided_decoding
from guard.guided._compiles import Compile, compile_key, grammar_mb
from guard.guided._limits import GuidedLimits
from guard.guided.backends import check_constraint, constraints, fmt_path
from guard.guided.schema import Memo, facts_of, largest_bound_product

__all__ = ["check_structured_outputs"]


def _custom_tool_grammars(body: Mapping[str, Any], limits: GuidedLimits) -> None:
    tools = body.get("tools")
    if not isinstance(tools, list | tuple):
        return
    for i, tool in enumerate(tools):
        custom = tool.get("custom") if isinstance(tool, Mapping) else None
        fmt = custom.get("format") if isinstance(custom, Mapping) else None
        grammar = fmt.get("grammar") if isinstance(fmt, Mapping) else None
        if not isinstance(grammar, Mapping):
            continue
        # The same check as the Responses API spelling, with this spelling's path.
        as_responses = {"tools": [{"format": {**grammar, "type": "grammar"}}]}
        try:
            check_guided_decoding(as_responses, limits)
        except GuardError as e:
            e.param = f"tools[{i}].custom.format.grammar.definition"
            raise


def _schemas(
    body: Mapping[str, Any], found: list[tuple[str, Any, tuple[str | int, ...]]]
) -> list[tuple[Any, tuple[str | int, ...]]]:
    """Every JSON schema of the request: those vLLM compiles, and tool parameters and the
    other spellings the schema check walks."""
    out = [(spec, path) for kind, spec, path in found if kind == "json"]
    rf = body.get("response_format")
    if isinstance(rf, Mapping):
        for key in ("schema", "value"):
            if isinstance(rf.get(key), Mapping):
                out.append((rf[key], ("response_format", key)))
    for field in ("tools", "functions"):
        entries = body.get(field)
        if not isinstance(entries, list | tuple):
            continue
        for i, tool in enumerate(entries):
            if not isinstance(tool, Mapping):
                continue
            fn = tool.get("function")
            if isinstance(fn, Mapping) and isinstance(fn.get("parameters"), Mapping):
                out.append((fn["parameters"], (field, i, "function", "parameters")))
            if isinstance(tool.get("parameters"), Mapping):
                out.append((tool["parameters"], (field, i, "parameters")))
    return out


def check_structured_outputs(
    body: Mapping[str, Any], limits: GuidedLimits, *, vocab: int | None = None
) -> tuple[Compile, ...]:
    """Refuse unsafe guided-decoding constraints (every ``guided_*`` code); when all are within
    ``limits``, return what the upstream would compile (one :class:`Compile` per distinct
    constraint, with its estimated cold cost; empty when ``limits.backends`` is). ``vocab``:
    the configured tokenizer's vocabulary size (:meth:`GuidedLimits.vocabulary`)."""
    # The check gathers every schema's facts as it walks it; the bound product, the routing
    # and the cost estimates read them instead of walking the schemas again.
    facts: Memo = {}
    check_guided_decoding(body, limits, facts)
    _custom_tool_grammars(body, limits)
    found = list(constraints(body))
    for spec, path in _schemas(body, found):
        bound = facts_of(spec, facts).bound if isinstance(spec, Mapping) else 1
        if bound is None:  # a $ref to follow
            bound = largest_bound_product(spec, 4 * limits.max_schema_nodes)
        product = bound
        if product > limits.max_schema_bound_product:
            raise LimitExceeded(
                "guided_schema_too_large",
                "nested minItems/maxItems and minLength/maxLength multiply to more than "
                f"{limits.max_schema_bound_product}",
                param=fmt_path(path),
            )
    if not limits.backends:
        return ()
    size = limits.vocabulary(vocab)
    compiles: dict[bytes, Compile] = {}
    for kind, spec, path in found:
        cold = check_constraint(kind, spec, path, limits, facts, vocab=size)
        key = compile_key(kind, spec)
        if key not in compiles:
            compiles[key] = Compile(key, cold, grammar_mb(cold, size))
    return tuple(compiles.values())

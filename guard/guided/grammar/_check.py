"""A grammar constraint checked: length, the linear scans (:mod:`._scan`) and, for the
``grammar`` field llama-cpp-python reads, llama.cpp's own parser (:mod:`._gbnf`); and the
grammars llama-cpp-python makes of a request's schemas (:mod:`._llamacpp`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from guard.errors import RegexRejected
from guard.guided._budget import ParamPath, RequestBudget, refuse, refuse_invalid
from guard.guided.grammar._gbnf import GbnfLimits, parse_gbnf
from guard.guided.grammar._llamacpp import llama_cpp_schemas, schema_grammar_problem
from guard.guided.grammar._scan import scan_gbnf, scan_nesting

__all__ = ["check_grammar", "check_llama_cpp_schemas"]


def check_grammar(ctx: RequestBudget, text: Any, path: ParamPath, *, gbnf_only: bool) -> None:
    limits = ctx.limits
    if not isinstance(text, str):
        refuse_invalid("guided_grammar_invalid", "a grammar must be a string", path)
    if len(text) > limits.max_grammar_chars:
        refuse(
            "guided_grammar_too_large",
            f"grammar longer than {limits.max_grammar_chars} characters",
            path,
        )
    try:
        scan_gbnf(
            text,
            max_depth=limits.max_grammar_depth,
            max_rules=limits.max_grammar_rules,
            max_repeat=limits.max_grammar_repeat,
            max_repeat_total=limits.max_grammar_repeat_total,
        )
        if not gbnf_only:
            scan_nesting(text, max_depth=limits.max_grammar_depth)
        else:  # llama.cpp's own reading: what its parser refuses crashes llama-cpp-python
            parse_gbnf(
                text,
                GbnfLimits.of(limits, limits.max_grammar_depth),
            )
    except RegexRejected as e:
        if e.code == "guided_grammar_invalid":
            refuse_invalid(e.code, e.message, path)
        refuse(e.code, e.message, path)


def check_llama_cpp_schemas(ctx: RequestBudget, body: Mapping[str, Any]) -> None:
    """The grammars llama-cpp-python would make of the request's schemas (after the schema
    limits, so the converter only sees bounded schemas)."""
    if not ctx.limits.llama_cpp_schemas:
        return
    for schema, path in llama_cpp_schemas(body):
        problem = schema_grammar_problem(schema, ctx.limits)
        if problem is None:
            continue
        message = f"the grammar llama-cpp-python makes of this schema: {problem.message}"
        if problem.code == "guided_grammar_invalid":
            refuse_invalid("guided_schema_grammar_invalid", message, path)
        refuse("guided_schema_grammar_too_large", message, path)

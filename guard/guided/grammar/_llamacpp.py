"""The grammars llama-cpp-python 0.3.36 makes of a request's JSON schemas, checked as
llama.cpp will parse them.

Its default chat handler (``chat_formatter_to_chat_completion_handler``) turns two schemas into
GBNF with its own converter (``json_schema_to_gbnf``, vendored byte for byte in
:mod:`guard.guided._vendor.llama_grammar`): ``response_format: {"type": "json_object",
"schema": ...}`` and the ``parameters`` of the tool that a ``tool_choice`` object names (legacy
``functions`` / ``function_call: {"name": ...}`` become tools and a tool choice first). The
converter copies regex escapes (``\\d``), writes constants with ``json.dumps`` escapes (``\\b``,
``\\f``) and unrolls ``minLength`` / ``maxLength`` into repetitions and nested groups: grammars
llama.cpp's parser refuses (the NULL sampler then crashes the server) or recurses too deep on.
When the converter raises, llama-cpp-python falls back to its generic JSON grammar, which
parses: nothing to refuse then.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from guard.errors import RegexRejected
from guard.guided._limits import GuidedLimits
from guard.guided._vendor.llama_grammar import json_schema_to_gbnf
from guard.guided.grammar._gbnf import GbnfLimits, parse_gbnf

__all__ = ["llama_cpp_schemas", "schema_grammar_problem"]

_Path = tuple[str | int, ...]


def llama_cpp_schemas(body: Mapping[str, Any]) -> Iterator[tuple[Any, _Path]]:
    """The schemas llama-cpp-python's chat handler converts, with where they sit."""
    rf = body.get("response_format")
    if isinstance(rf, Mapping) and rf.get("type") == "json_object" and "schema" in rf:
        yield rf["schema"], ("response_format", "schema")
    tools = body.get("tools")
    field = "tools"
    functions = body.get("functions")
    if functions is not None:
        tools = [{"function": f} for f in functions] if isinstance(functions, list) else None
        field = "functions"
    choice = body.get("tool_choice")
    call = body.get("function_call")
    if isinstance(call, Mapping) and "name" in call:
        choice = {"function": {"name": call["name"]}}
    elif call in ("none", "auto"):
        choice = call
    if not isinstance(choice, Mapping) or not isinstance(tools, list):
        return
    named = choice.get("function")
    name = named.get("name") if isinstance(named, Mapping) else None
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if isinstance(fn, Mapping) and fn.get("name") == name and "parameters" in fn:
            path: _Path = (
                (field, i, "parameters")
                if field == "functions"
                else (field, i, "function", "parameters")
            )
            yield fn["parameters"], path
            return


def schema_grammar_problem(schema: Any, limits: GuidedLimits) -> RegexRejected | None:
    """Why llama.cpp could not parse (or parse safely) the grammar llama-cpp-python makes of
    ``schema``; None when it can or when the converter gives up (the JSON fallback)."""
    try:
        grammar = json_schema_to_gbnf(json.dumps(schema))
    except Exception:  # llama-cpp-python catches every one and falls back to JSON
        return None
    try:
        parse_gbnf(
            grammar,
            GbnfLimits.of(limits, limits.max_schema_grammar_depth),
        )
    except RegexRejected as e:
        return e
    return None

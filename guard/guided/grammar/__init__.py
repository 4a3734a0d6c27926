"""Grammars in guided-decoding constraints (GBNF, EBNF, Lark), read before an upstream parses
them.

- :func:`check_grammar`, :func:`check_llama_cpp_schemas`: a grammar constraint, and the grammars
  llama-cpp-python makes of a request's schemas, against the request's budget (:mod:`._check`);
- :func:`scan_gbnf`, :func:`scan_nesting`: linear scans for nesting, rule counts, ``{m,n}``
  repetition and nullable repetition, for every grammar dialect (:mod:`._scan`);
- :func:`parse_gbnf`: llama.cpp's own GBNF parser, mirrored: what it refuses crashes
  llama-cpp-python (:mod:`._gbnf`);
- :func:`llama_cpp_schemas`, :func:`schema_grammar_problem`: the grammars llama-cpp-python
  makes of a request's JSON schemas, checked as llama.cpp will parse them (:mod:`._llamacpp`,
  with llama-cpp-python's converter vendored in :mod:`guard.guided._vendor`).
"""

from __future__ import annotations

from guard.guided.grammar._check import check_grammar, check_llama_cpp_schemas
from guard.guided.grammar._gbnf import GbnfLimits, parse_gbnf
from guard.guided.grammar._llamacpp import llama_cpp_schemas, schema_grammar_problem
from guard.guided.grammar._scan import scan_gbnf, scan_nesting

__all__ = [
    "GbnfLimits",
    "check_grammar",
    "check_llama_cpp_schemas",
    "llama_cpp_schemas",
    "parse_gbnf",
    "scan_gbnf",
    "scan_nesting",
    "schema_grammar_problem",
]

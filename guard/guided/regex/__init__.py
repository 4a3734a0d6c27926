"""Regexes in guided-decoding constraints, read before any engine compiles them.

- :func:`check_regex`: one regex constraint against the request's budget: the scan, then RE2
  (:mod:`._check`);
- :func:`scan_regex`: one left-to-right pass that refuses deep nesting, large repetition
  products and ambiguous nested repetition, and estimates RE2's program size (:mod:`._scan`);
- :func:`re2_program_size`: RE2 compiles it under a memory cap; what RE2 refuses is refused
  (:mod:`._re2`);
- :func:`parse_regex`: a small AST read as Python's ``re`` reads it, which the backend cost
  models price (:mod:`._ast`);
- :func:`xgrammar_rejects_regex`, :func:`guidance_rejects_regex`: the syntax those backends'
  converters refuse, which vLLM's routing reads (:mod:`._syntax`).
"""

from __future__ import annotations

from guard.guided.regex._ast import (
    ALT,
    ANY_CS,
    ASCII_MASK,
    CAT,
    EPS,
    LIT,
    MAX_DEPTH,
    REP,
    Node,
    Unpriceable,
    ascii_printable,
    covers,
    meets,
    multibyte,
    parse_regex,
    rust_reads_differently,
)
from guard.guided.regex._check import check_regex
from guard.guided.regex._re2 import re2_program_size
from guard.guided.regex._scan import INVALID, UNSAFE, ScanResult, scan_regex
from guard.guided.regex._syntax import guidance_rejects_regex, xgrammar_rejects_regex

__all__ = [
    "ALT",
    "ANY_CS",
    "ASCII_MASK",
    "CAT",
    "EPS",
    "INVALID",
    "LIT",
    "MAX_DEPTH",
    "REP",
    "UNSAFE",
    "Node",
    "ScanResult",
    "Unpriceable",
    "ascii_printable",
    "check_regex",
    "covers",
    "guidance_rejects_regex",
    "meets",
    "multibyte",
    "parse_regex",
    "re2_program_size",
    "rust_reads_differently",
    "scan_regex",
    "xgrammar_rejects_regex",
]

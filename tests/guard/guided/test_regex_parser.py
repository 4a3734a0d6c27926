"""The guided check's own regex reader against the one the cost models were calibrated with
(``re._parser`` turned into the same trees): node by node, or both refusing to price."""

from __future__ import annotations

import json
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from guard.guided.regex import Node, Unpriceable, parse_regex
from payloads import load_corpus
from tests.guard.guided._sre_reference import reference_parse, same_tree

HANDWRITTEN = [
    "",
    "a",
    "(a|b)*a(a|b){16}",
    "[ab]*a[ab]{18}",
    ".*x.{16}",
    "(.{0,100}){0,100}",
    r"\d{3}-\d{4}",
    r"[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}",
    r"^(?:[0-9]{1,3}\.){3}[0-9]{1,3}$",
    r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
    r"(?i)yes|no|maybe",
    r"(?s).+?\n",
    r"[^\W\d_]+",
    r"\w+\s\S*\b",
    r"(a+)+b",
    r"a{2,}?b{,3}c{3}",
    r"[\]\-\\^]",
    r"[[:alpha:]]",
    r"[a-z&&[^x]]",
    r"(?P<x>a)(?P=x)",
    r"(?=a)b",
    r"\u00e9+\x41\101",
    r"[\u0100-\uffff]{2}",
    "(((a)))",
    "a|",
    "|",
    "(?:)",
    "a{1000}",
    "a{99999}",
    "[",
    "(",
    "a**",
    r"\p{L}",
]


def _corpus_patterns() -> list[str]:
    found: set[str] = set()

    def walk(value: object) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("regex", "pattern") and isinstance(item, str):
                    found.add(item)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    for payload in load_corpus():
        if payload.generated:
            continue
        try:
            walk(json.loads(payload.body_bytes()))
        except ValueError:
            continue
    return sorted(found)


def _agree(pattern: str) -> None:
    ours: Node | None
    ref: Node | None
    try:
        ours = parse_regex(pattern)
    except Unpriceable:
        ours = None
    try:
        ref = reference_parse(pattern)
    except Unpriceable:
        ref = None
    if ref is None:
        # The reference refusing (Python cannot read it) must not be priced as cheap by ours
        # unless Python's syntax is the stricter one; both refusing is the common case.
        assert ours is None or _python_only_error(pattern), pattern
        return
    assert ours is not None, f"ours refuses what the reference reads: {pattern!r}"
    assert same_tree(ours, ref), f"trees differ: {pattern!r}"


def _python_only_error(pattern: str) -> bool:
    try:
        re.compile(pattern)
    except re.error:
        return True
    return False


def test_handwritten_patterns_agree() -> None:
    for pattern in HANDWRITTEN:
        _agree(pattern)


def test_corpus_patterns_agree() -> None:
    patterns = _corpus_patterns()
    assert patterns, "the corpus has guided regexes and schema patterns"
    for pattern in patterns:
        _agree(pattern)


_ATOMS = st.sampled_from(
    ["a", "b", ".", r"\d", r"\w", r"\s", "[ab]", "[^a]", "[a-z0-9]", r"\.", "x", "é", r"\n"]
)
_QUANT = st.sampled_from(["", "*", "+", "?", "{2}", "{1,3}", "{0,}", "*?", "{,2}"])


@st.composite
def _regexes(draw: st.DrawFn, depth: int = 0) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        if depth < 3 and draw(st.booleans()):
            inner = draw(_regexes(depth + 1))
            if draw(st.booleans()):
                inner += "|" + draw(_regexes(depth + 1))
            atom = draw(st.sampled_from(["(", "(?:", "(?i:"])) + inner + ")"
        else:
            atom = draw(_ATOMS)
        parts.append(atom + draw(_QUANT))
    return "".join(parts)


@settings(max_examples=300, deadline=None)
@given(_regexes())
def test_generated_patterns_agree(pattern: str) -> None:
    _agree(pattern)

"""A small regex AST for the backend cost models (:mod:`guard.guided._backend_cost`).

The pattern is parsed with the standard library's ``re`` parser (the check has already bounded
its length, nesting and repetition products, so the parse is linear and shallow) and turned into
five node kinds: literal class, concatenation, alternation, repetition, empty. Runs of the same
atom are merged into one counted repetition (``[ab][ab][ab]`` is ``[ab]{3}``) so that spelling a
count out does not hide it from the models. Character sets are ints: bits 0-127 are ASCII, bit
128 "some non-ASCII", bit 129 "every non-ASCII code point", bit 130 "a Unicode category"
(``\\d``, ``\\w``: scattered ranges, many UTF-8 automaton states), bit 131 "the word
category" (``\\w``, ``\\W``: the largest).

Constructs the models cannot price (look-around, back-references, word boundaries) raise
:class:`Unpriceable`; the caller decides what that means for each backend.
"""

from __future__ import annotations

import functools
import gc
import re
import warnings
from typing import Any

__all__ = [
    "ALT",
    "ANY_CS",
    "ASCII_MASK",
    "CAT",
    "EPS",
    "LIT",
    "REP",
    "Node",
    "Unpriceable",
    "ascii_printable",
    "covers",
    "meets",
    "multibyte",
    "parse_regex",
]

try:  # CPython 3.11+: the parser lives in re._parser (sre_parse warns on import)
    import re._constants as _C  # type: ignore[import-not-found,unused-ignore]
    import re._parser as _P  # type: ignore[import-not-found,unused-ignore]
except ImportError:  # pragma: no cover
    import sre_constants as _C  # type: ignore[no-redef,unused-ignore]
    import sre_parse as _P  # type: ignore[no-redef,unused-ignore]

C: Any = _C
P: Any = _P

LIT, CAT, ALT, REP, EPS = range(5)

ASCII_MASK = (1 << 128) - 1
_SOME_NA = 1 << 128
_ALL_NA = 1 << 129
_CATEGORY = 1 << 130
_WORD_CATEGORY = 1 << 131  # \w / \W: the largest Unicode class, ~100 UTF-8 automaton states
ANY_CS = ASCII_MASK | _SOME_NA | _ALL_NA
_DOT = ANY_CS & ~(1 << 10)
_PRINTABLE = ((1 << 127) - 1) ^ ((1 << 32) - 1)  # 0x20..0x7E
_UPPER = ((1 << 26) - 1) << 65
_LOWER = ((1 << 26) - 1) << 97
_MAX_COUNT = 1 << 30
_IGNORECASE = int(re.IGNORECASE)
_DOTALL = int(re.DOTALL)


class Unpriceable(Exception):
    """A construct the cost models do not price (look-around, back-reference, ...)."""


def _rng(lo: int, hi: int) -> int:
    mask = 0
    if lo < 128:
        top = min(hi, 127)
        mask = ((1 << (top + 1)) - 1) ^ ((1 << lo) - 1)
    if hi >= 128:
        mask |= _SOME_NA
        if lo <= 128 and hi >= 0x10FFFF:
            mask |= _ALL_NA
    return mask


_DIGIT = _rng(48, 57)
_WORD_A = _DIGIT | _rng(65, 90) | _rng(97, 122) | (1 << 95)
_SPACE_A = (1 << 9) | (1 << 10) | (1 << 11) | (1 << 12) | (1 << 13) | (1 << 32)


def _category(cat: Any) -> int:
    """Rust's regex (outlines-core, llguidance) reads \\d \\w \\s as Unicode classes."""
    if cat is C.CATEGORY_DIGIT:
        return _DIGIT | _SOME_NA | _CATEGORY
    if cat is C.CATEGORY_WORD:
        return _WORD_A | _SOME_NA | _CATEGORY | _WORD_CATEGORY
    if cat is C.CATEGORY_SPACE:
        return _SPACE_A | _SOME_NA | _CATEGORY
    if cat is C.CATEGORY_NOT_DIGIT:
        return (ASCII_MASK & ~_DIGIT) | _SOME_NA | _CATEGORY
    if cat is C.CATEGORY_NOT_WORD:
        return (ASCII_MASK & ~_WORD_A) | _SOME_NA | _CATEGORY | _WORD_CATEGORY
    if cat is C.CATEGORY_NOT_SPACE:
        return (ASCII_MASK & ~_SPACE_A) | _SOME_NA | _ALL_NA | _CATEGORY
    return ANY_CS


def _fold(mask: int) -> int:
    return mask | ((mask & _UPPER) << 32) | ((mask & _LOWER) >> 32)


def _invert(mask: int) -> int:
    out = ASCII_MASK & ~mask
    if not mask & _ALL_NA:
        out |= _SOME_NA  # something non-ASCII is left
    if not mask & _SOME_NA:
        out |= _ALL_NA
    return out | (mask & (_CATEGORY | _WORD_CATEGORY))


def meets(a: int, b: int) -> bool:
    """Whether two sets may share a character (over-approximated for non-ASCII)."""
    return bool(a & b & ASCII_MASK) or bool(a & b & _SOME_NA)


def covers(a: int, b: int) -> bool:
    """Whether ``a`` surely contains ``b`` (under-approximated for non-ASCII)."""
    if b & ASCII_MASK & ~a:
        return False
    return not (b & _SOME_NA) or bool(a & _ALL_NA)


def ascii_printable(mask: int) -> int:
    return (mask & _PRINTABLE).bit_count()


def multibyte(mask: int) -> bool:
    return bool(mask & _SOME_NA)


class Node:
    """One AST node with the attributes the models read (filled by :func:`_attrs`)."""

    __slots__ = (
        "chars",
        "cs",
        "first",
        "hi",
        "kids",
        "kind",
        "last",
        "lo",
        "maxlen",
        "minlen",
        "nlast",
        "nullable",
    )

    def __init__(
        self,
        kind: int,
        cs: int = 0,
        kids: list[Node] | None = None,
        lo: int = 0,
        hi: int | None = 0,
    ) -> None:
        self.kind = kind
        self.cs = cs
        self.kids: list[Node] = kids if kids is not None else []
        self.lo = lo
        self.hi = hi  # None: unbounded
        self.nullable = False
        self.first = 0
        self.last = 0
        self.chars = 0
        self.nlast = 0
        self.minlen = 0
        self.maxlen = 0.0


def _in_items(items: Any, flags: int) -> int:
    neg = False
    acc = 0
    for op, av in items:
        if op is C.NEGATE:
            neg = True
        elif op is C.LITERAL:
            acc |= _lit_cs(av, flags)
        elif op is C.RANGE:
            acc |= _rng(av[0], av[1])
            if flags & _IGNORECASE:
                acc = _fold(acc)
        elif op is C.CATEGORY:
            acc |= _category(av)
        else:
            acc |= ANY_CS
    return _invert(acc) if neg else acc


def _lit_cs(c: int, flags: int) -> int:
    s = _rng(c, c)
    return _fold(s) if flags & _IGNORECASE else s


def _count(value: int) -> int | None:
    return None if value >= C.MAXREPEAT else min(value, _MAX_COUNT)


def _from_sre(sub: Any, flags: int) -> Node:
    items: list[Node] = []
    for op, av in sub:
        if op is C.LITERAL:
            items.append(Node(LIT, cs=_lit_cs(av, flags)))
        elif op is C.NOT_LITERAL:
            items.append(Node(LIT, cs=_invert(_rng(av, av))))
        elif op is C.ANY:
            items.append(Node(LIT, cs=ANY_CS if flags & _DOTALL else _DOT))
        elif op is C.IN:
            items.append(Node(LIT, cs=_in_items(av, flags)))
        elif op is C.BRANCH:
            items.append(Node(ALT, kids=[_from_sre(b, flags) for b in av[1]]))
        elif op is C.SUBPATTERN:
            _group, add, delete, p = av
            items.append(_from_sre(p, (flags | int(add)) & ~int(delete)))
        elif op in _REPEATS:
            lo, hi, p = av
            items.append(Node(REP, kids=[_from_sre(p, flags)], lo=_count(lo) or 0, hi=_count(hi)))
        elif op is C.AT:
            if av in (C.AT_BOUNDARY, C.AT_NON_BOUNDARY):
                raise Unpriceable("word boundary")
            items.append(Node(EPS))
        elif op is _ATOMIC:
            items.append(_from_sre(av, flags))
        elif op in (C.ASSERT, C.ASSERT_NOT):
            raise Unpriceable("look-around")
        else:  # GROUPREF, GROUPREF_EXISTS, ...
            raise Unpriceable("back-reference")
    return _canon_cat(items)


_REPEATS = tuple(
    x for x in (C.MAX_REPEAT, C.MIN_REPEAT, getattr(C, "POSSESSIVE_REPEAT", None)) if x is not None
)
_ATOMIC = getattr(C, "ATOMIC_GROUP", object())


def _same(a: Node, b: Node) -> bool:
    if a.kind != b.kind:
        return False
    if a.kind == LIT:
        return a.cs == b.cs
    if a.kind == REP:
        return a.lo == b.lo and a.hi == b.hi and _same(a.kids[0], b.kids[0])
    if a.kind in (CAT, ALT):
        return len(a.kids) == len(b.kids) and all(
            _same(x, y) for x, y in zip(a.kids, b.kids, strict=True)
        )
    return True


def _canon_cat(items: list[Node]) -> Node:
    """Merge runs of identical atoms: X X X -> X{3}."""
    flat: list[Node] = []
    for it in items:
        if it.kind == CAT:
            flat.extend(it.kids)
        elif it.kind != EPS:
            flat.append(it)
    out: list[Node] = []
    for it in flat:
        base, lo, hi = (it.kids[0], it.lo, it.hi) if it.kind == REP else (it, 1, 1)
        if out:
            prev = out[-1]
            pbase, plo, phi = (prev.kids[0], prev.lo, prev.hi) if prev.kind == REP else (prev, 1, 1)
            if (base.kind == LIT or base.kind == ALT) and _same(pbase, base):
                out[-1] = Node(
                    REP,
                    kids=[pbase],
                    lo=min(plo + lo, _MAX_COUNT),
                    hi=None if phi is None or hi is None else min(phi + hi, _MAX_COUNT),
                )
                continue
        out.append(it)
    if not out:
        return Node(EPS)
    if len(out) == 1:
        return out[0]
    return Node(CAT, kids=out)


def _attrs(n: Node) -> Node:
    """nullable / first / last / chars / lengths / resting places, bottom-up."""
    k = n.kind
    if k == EPS:
        n.nullable = True
    elif k == LIT:
        n.first = n.last = n.chars = n.cs
        n.nlast = n.minlen = 1
        n.maxlen = 1.0
    elif k == CAT:
        for kid in n.kids:
            _attrs(kid)
        n.nullable = all(kid.nullable for kid in n.kids)
        for kid in n.kids:
            n.first |= kid.first
            if not kid.nullable:
                break
        for kid in reversed(n.kids):
            n.last |= kid.last
            n.nlast += kid.nlast
            if not kid.nullable:
                break
        for kid in n.kids:
            n.chars |= kid.chars
        n.minlen = sum(kid.minlen for kid in n.kids)
        n.maxlen = sum(kid.maxlen for kid in n.kids)
    elif k == ALT:
        for kid in n.kids:
            _attrs(kid)
            n.first |= kid.first
            n.last |= kid.last
            n.chars |= kid.chars
            n.nlast += kid.nlast
        n.nullable = any(kid.nullable for kid in n.kids)
        n.minlen = min(kid.minlen for kid in n.kids)
        n.maxlen = max(kid.maxlen for kid in n.kids)
    else:
        b = _attrs(n.kids[0])
        n.nullable = n.lo == 0 or b.nullable
        n.first, n.last, n.chars, n.nlast = b.first, b.last, b.chars, b.nlast
        n.minlen = b.minlen * n.lo
        n.maxlen = float("inf") if n.hi is None else b.maxlen * n.hi
    return n


def _rust_reads_differently(pattern: str) -> bool:
    """An unescaped ``[`` inside a class, or ``&&`` / ``--`` / ``~~`` there: Rust's regex
    (outlines-core, llguidance) reads nested classes and set operations where Python's parser
    reads literals (``[a-z["a"]"b"]{83,}`` is one wide class counted 83 times in Rust, a class
    then ``"b"]{83,}`` here: 1.1 s at 32k estimated as 0.3 s). Linear."""
    depth = start = 0
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if depth:
            if c == "[":
                return True
            if c == "]" and i > start:
                depth = 0
            elif pattern.startswith(("&&", "--", "~~"), i) and i > start:
                return True
        elif c == "[":
            depth = 1
            start = i + 1
            if pattern.startswith("^", start):
                start += 1
            if pattern.startswith("]", start):
                start += 1  # a leading ] is a literal
                i = start
                continue
        i += 1
    return False


@functools.lru_cache(maxsize=512)
def parse_regex(pattern: str) -> Node:
    """The pattern's AST with attributes; :class:`Unpriceable` when it cannot be priced (or
    Python's parser does not read it: Rust-only syntax such as ``\\p{L}``). Cached: tools and
    clients repeat the same patterns; the tree is never modified after it is built."""
    if _rust_reads_differently(pattern):
        raise Unpriceable("a class that Rust's regex reads as nested classes or set operations")
    # The tree is acyclic and at most a few thousand nodes: the cyclic collector would only
    # rescan the process's heap while it is built (what made a 2 KB pattern cost 1.5x a 1 KB
    # one), so it waits until the tree is done.
    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "possible nested set" on [[:alpha:]]
                tree = P.parse(pattern)
        except (re.error, RecursionError, OverflowError, ValueError, TypeError) as exc:
            raise Unpriceable("not readable") from exc
        return _attrs(_from_sre(tree, int(tree.state.flags)))
    finally:
        if collecting:
            gc.enable()

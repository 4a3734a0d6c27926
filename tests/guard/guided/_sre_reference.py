"""The regex reading the backend cost models were calibrated with: Python's ``re._parser``
turned into :class:`~guard.guided.regex._ast.Node` trees (the implementation before issue 16's
speed work). ``guard.guided.regex._ast.parse_regex`` reads patterns with a parser of its own;
the tests compare its trees with these, node by node.
"""

from __future__ import annotations

import re
import re._constants as _C  # type: ignore[import-not-found,unused-ignore]
import re._parser as _P  # type: ignore[import-not-found,unused-ignore]
import warnings
from typing import Any

from guard.guided.regex._ast import _ALL_NA as _ALL_NA
from guard.guided.regex._ast import _CATEGORY as _CATEGORY
from guard.guided.regex._ast import _DIGIT as _DIGIT
from guard.guided.regex._ast import _DOT as _DOT
from guard.guided.regex._ast import _SOME_NA as _SOME_NA
from guard.guided.regex._ast import _SPACE_A as _SPACE_A
from guard.guided.regex._ast import _WORD_A as _WORD_A
from guard.guided.regex._ast import _WORD_CATEGORY as _WORD_CATEGORY
from guard.guided.regex._ast import (
    ALT,
    ANY_CS,
    CAT,
    EPS,
    LIT,
    REP,
    Node,
    Unpriceable,
    rust_reads_differently,
)
from guard.guided.regex._ast import ASCII_MASK as ASCII_MASK
from guard.guided.regex._ast import _fold as _fold
from guard.guided.regex._ast import _invert as _invert
from guard.guided.regex._ast import _rng as _rng
from guard.guided.regex._ast import _same as _same

C: Any = _C
P: Any = _P
_MAX_COUNT = 1 << 30
_IGNORECASE = int(re.IGNORECASE)
_DOTALL = int(re.DOTALL)


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


def reference_parse(pattern: str) -> Node:
    """``parse_regex`` as it was: ``re._parser``, then the tree conversion above."""
    if rust_reads_differently(pattern):
        raise Unpriceable("a class that Rust's regex reads as nested classes or set operations")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = P.parse(pattern)
    except (re.error, RecursionError, OverflowError, ValueError, TypeError) as exc:
        raise Unpriceable("not readable") from exc
    return _attrs(_from_sre(tree, int(tree.state.flags)))


def same_tree(a: Node, b: Node) -> bool:
    """Node by node: kinds, classes, counts, children and every attribute the models read."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if (x.kind, x.cs, x.lo, x.hi, x.nullable, x.first, x.last, x.chars, x.nlast) != (
            y.kind,
            y.cs,
            y.lo,
            y.hi,
            y.nullable,
            y.first,
            y.last,
            y.chars,
            y.nlast,
        ):
            return False
        if x.minlen != y.minlen or len(x.kids) != len(y.kids):
            return False
        if x.maxlen != y.maxlen and not (x.maxlen != x.maxlen and y.maxlen != y.maxlen):
            return False  # equal, or both NaN (an unbounded body counted {0})
        stack.extend(zip(x.kids, y.kids, strict=True))
    return True

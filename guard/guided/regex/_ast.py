"""A small regex AST for the backend cost models (:mod:`guard.guided.backends._cost`).

The pattern is read as Python's ``re`` parser reads it (``re._parser``: the same acceptance,
the same tree, including its rewrites of alternations: a common prefix of every branch is
factored out, and branches of single characters become one class), by a parser of its own that
reads plain runs with one C-level match and keeps the parse in flat tuples: ~10x cheaper than
``re._parser`` plus a tree of its objects. The tree has five node kinds: literal class,
concatenation, alternation, repetition, empty. Runs of the same atom are merged into one
counted repetition (``[ab][ab][ab]`` is ``[ab]{3}``) so that spelling a count out does not hide
it from the models. Character sets are ints: bits 0-127 are ASCII, bit 128 "some non-ASCII",
bit 129 "every non-ASCII code point", bit 130 "a Unicode category" (``\\d``, ``\\w``:
scattered ranges, many UTF-8 automaton states), bit 131 "the word category" (``\\w``, ``\\W``:
the largest). Literal classes and the empty node are shared (never modified), so a long run of
literals costs one list entry per character, not one object.

Constructs the models cannot price (look-around, back-references, word boundaries) raise
:class:`Unpriceable`, as does anything Python's parser refuses (then the reason is "not
readable") and nesting deeper than :data:`MAX_DEPTH` groups; the caller decides what that means
for each backend. ``tests/guard/guided/_sre_reference.py`` keeps the reading through
``re._parser`` the models were calibrated with, and the tests compare the two trees.
"""

from __future__ import annotations

import re
import unicodedata
from itertools import count
from typing import Any

__all__ = [
    "ALT",
    "ANY_CS",
    "ASCII_MASK",
    "CAT",
    "EPS",
    "LIT",
    "MAX_DEPTH",
    "REP",
    "Node",
    "Unpriceable",
    "ascii_printable",
    "covers",
    "meets",
    "multibyte",
    "parse_regex",
    "rust_reads_differently",
]

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
_INF = float("inf")
# Python's re: flag bits and limits (re._constants).
_IGNORECASE = int(re.IGNORECASE)
_DOTALL = int(re.DOTALL)
_VERBOSE = int(re.VERBOSE)
_ASCII_FLAG = int(re.ASCII)
_UNICODE_FLAG = int(re.UNICODE)
_LOCALE_FLAG = int(re.LOCALE)
_TEMPLATE_FLAG = 1  # SRE_FLAG_TEMPLATE
_DEBUG_FLAG = int(re.DEBUG)
_TYPE_FLAGS = _ASCII_FLAG | _LOCALE_FLAG | _UNICODE_FLAG
_GLOBAL_FLAGS = _DEBUG_FLAG | _TEMPLATE_FLAG
_FLAGS = {
    "i": _IGNORECASE,
    "L": _LOCALE_FLAG,
    "m": int(re.MULTILINE),
    "s": _DOTALL,
    "x": _VERBOSE,
    "a": _ASCII_FLAG,
    "t": _TEMPLATE_FLAG,
    "u": _UNICODE_FLAG,
}
_MAXREPEAT = 4294967295
_MAXGROUPS = 1073741823
MAX_DEPTH = 100
"""Deepest group nesting read (``re._parser`` recurses per group; the check caps nesting at
``max_regex_nesting``, 32 by default, well before this)."""


class Unpriceable(Exception):
    """A construct the cost models do not price (look-around, back-reference, ...)."""


class _Bad(Exception):
    """Python's parser would refuse the pattern."""


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
# Rust's regex (outlines-core, llguidance) reads \d \w \s as Unicode classes.
_CATEGORY_CS = {
    "d": _DIGIT | _SOME_NA | _CATEGORY,
    "w": _WORD_A | _SOME_NA | _CATEGORY | _WORD_CATEGORY,
    "s": _SPACE_A | _SOME_NA | _CATEGORY,
    "D": (ASCII_MASK & ~_DIGIT) | _SOME_NA | _CATEGORY,
    "W": (ASCII_MASK & ~_WORD_A) | _SOME_NA | _CATEGORY | _WORD_CATEGORY,
    "S": (ASCII_MASK & ~_SPACE_A) | _SOME_NA | _ALL_NA | _CATEGORY,
}


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
    """One AST node with the attributes the models read, set when it is built: whether it
    matches empty, the characters that can start, end and appear in a match, the number of
    leaves a match can end on, and the length range."""

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


def _make_eps() -> Node:
    n = Node(EPS)
    n.nullable = True
    return n


_EPS_NODE = _make_eps()
_LITS: dict[int, Node] = {}


def _lit(cs: int) -> Node:
    """The (shared) literal-class node of ``cs``."""
    n = _LITS.get(cs)
    if n is None:
        if len(_LITS) >= 4096:
            _LITS.clear()
        n = Node(LIT, cs)
        n.first = n.last = n.chars = cs
        n.nlast = n.minlen = 1
        n.maxlen = 1.0
        _LITS[cs] = n
    return n


def _cat(kids: list[Node]) -> Node:
    n = Node(CAT, kids=kids)
    nullable = True
    first = chars = minlen = 0
    maxlen: float = 0
    for kid in kids:
        if nullable:
            first |= kid.first
            nullable = kid.nullable
        chars |= kid.chars
        minlen += kid.minlen
        maxlen += kid.maxlen  # summed left to right from 0, as sum() does
    last = nlast = 0
    for kid in reversed(kids):
        last |= kid.last
        nlast += kid.nlast
        if not kid.nullable:
            break
    n.nullable = nullable
    n.first, n.last, n.nlast, n.chars = first, last, nlast, chars
    n.minlen = minlen
    n.maxlen = maxlen
    return n


def _alt(kids: list[Node]) -> Node:
    n = Node(ALT, kids=kids)
    first = last = chars = nlast = 0
    for kid in kids:
        first |= kid.first
        last |= kid.last
        chars |= kid.chars
        nlast += kid.nlast
    n.first, n.last, n.chars, n.nlast = first, last, chars, nlast
    n.nullable = any(kid.nullable for kid in kids)
    n.minlen = min(kid.minlen for kid in kids)
    n.maxlen = max(kid.maxlen for kid in kids)
    return n


def _rep(body: Node, lo: int, hi: int | None) -> Node:
    n = Node(REP, kids=[body], lo=lo, hi=hi)
    n.nullable = lo == 0 or body.nullable
    n.first, n.last, n.chars, n.nlast = body.first, body.last, body.chars, body.nlast
    n.minlen = body.minlen * lo
    n.maxlen = _INF if hi is None else body.maxlen * hi
    return n


def _same(a: Node, b: Node) -> bool:
    if a is b:
        return True
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


# ---- reading the pattern as re._parser does ----------------------------------------------------
#
# Items are tuples compared as re._parser compares its own (a common prefix of alternatives is
# factored out when the items are equal): literals, classes, "any", anchors and group
# references by value; groups, repetitions, alternations and assertions never equal (each
# carries a unique serial). Class members: (0, cp) literal, (1, lo, hi) range, (2, letter)
# category, (3,) negation.

_I_LIT, _I_NOT_LIT, _I_ANY, _I_IN, _I_BRANCH, _I_SUB, _I_AT, _I_REPEAT = range(8)
_I_ATOMIC, _I_ASSERT, _I_GROUPREF, _I_COND = range(8, 12)
_NEGATE = (3,)
_ANY_ITEM = (_I_ANY,)
_SERIAL = count()

_SPECIAL = ".\\[{()*+?^$|"
_WHITESPACE = frozenset(" \t\n\r\v\f")
_DIGITS = frozenset("0123456789")
_OCTDIGITS = frozenset("01234567")
_HEXDIGITS = frozenset("0123456789abcdefABCDEF")
_ASCIILETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_ESCAPES = {"a": 7, "b": 8, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11, "\\": 92}
_CLASS_CATEGORIES = frozenset("dDsSwW")
_AT_ESCAPES = {"A": (_I_AT, "A"), "b": (_I_AT, "b"), "B": (_I_AT, "B"), "Z": (_I_AT, "Z")}
_IN_ESCAPES = {c: (_I_IN, ((2, c),)) for c in _CLASS_CATEGORIES}
_RUN = re.compile(r"[^.\\\[{()*+?^$|]+")
_RUN_VERBOSE = re.compile(r"[^.\\\[{()*+?^$| \t\n\r\x0b\x0c#]+")
# A class's extent: a leading ] is a member; escapes are skipped; the next ] ends it.
_COMMENT = re.compile(r"(?:[^\\\n]|\\[\s\S])*")  # a verbose comment's tokens, to the newline
_CLASS_EXTENT = re.compile(r"\[\^?\]?(?:[^\]\\]|\\.)*\]", re.DOTALL)
_LIT_ITEMS: dict[str, tuple[int, int]] = {}
_CLASS_CACHE: dict[str, tuple[Any, ...] | None] = {}


def _lit_item(ch: str) -> tuple[int, int]:
    item = _LIT_ITEMS.get(ch)
    if item is None:
        if len(_LIT_ITEMS) >= 4096:
            _LIT_ITEMS.clear()
        item = _LIT_ITEMS[ch] = (_I_LIT, ord(ch))
    return item


class _Reader:
    """re._parser's ``_parse_sub`` / ``_parse`` over an index instead of its tokenizer."""

    def __init__(self, p: str) -> None:
        self.p = p
        self.n = len(p)
        self.i = 0
        self.flags = 0
        self.closed: list[bool] = [False]  # group 0; then one per opened group
        self.names: dict[str, int] = {}
        self.lookbehind: int | None = None
        self.refpos: set[int] = set()

    # -- the tokenizer: a token is one character or a backslash and the next ---------------------

    def peek(self) -> str | None:
        i = self.i
        if i >= self.n:
            return None
        c = self.p[i]
        return self.p[i : i + 2] if c == "\\" else c

    def get(self) -> str | None:
        tok = self.peek()
        if tok is not None:
            self.i += len(tok)
        return tok

    def match(self, ch: str) -> bool:
        if self.i < self.n and self.p[self.i] == ch:
            self.i += 1
            return True
        return False

    def getwhile(self, n: int, charset: frozenset[str]) -> str:
        out = ""
        for _ in range(n):
            i = self.i
            if i >= self.n or self.p[i] not in charset:
                break
            out += self.p[i]
            self.i = i + 1
        return out

    def getuntil(self, terminator: str) -> str:
        out = ""
        while True:
            tok = self.get()
            if tok is None:
                raise _Bad
            if tok == terminator:
                if not out:
                    raise _Bad
                return out
            out += tok

    # -- groups ------------------------------------------------------------------------------------

    def checkgroup(self, gid: int) -> bool:
        return gid < len(self.closed) and self.closed[gid]

    def checklookbehindgroup(self, gid: int) -> None:
        if self.lookbehind is not None and (not self.checkgroup(gid) or gid >= self.lookbehind):
            raise _Bad

    # -- escapes -----------------------------------------------------------------------------------

    def _common_escape(self, c: str) -> tuple[int, int] | None:
        """\\x, \\u, \\U and \\N: the same in and out of classes."""
        if c == "x":
            digits = self.getwhile(2, _HEXDIGITS)
            if len(digits) != 2:
                raise _Bad
            return _I_LIT, int(digits, 16)
        if c == "u":
            digits = self.getwhile(4, _HEXDIGITS)
            if len(digits) != 4:
                raise _Bad
            return _I_LIT, int(digits, 16)
        if c == "U":
            digits = self.getwhile(8, _HEXDIGITS)
            if len(digits) != 8 or int(digits, 16) > 0x10FFFF:
                raise _Bad
            return _I_LIT, int(digits, 16)
        if c == "N":
            if not self.match("{"):
                raise _Bad
            name = self.getuntil("}")
            try:
                return _I_LIT, ord(unicodedata.lookup(name))
            except (KeyError, TypeError):
                raise _Bad from None
        return None

    def escape(self, c: str) -> tuple[Any, ...]:
        """An escape outside a class (``c`` follows the backslash)."""
        item = _IN_ESCAPES.get(c) or _AT_ESCAPES.get(c)
        if item is not None:
            return item
        code = _ESCAPES.get(c)
        if code is not None:
            return _I_LIT, code
        got = self._common_escape(c)
        if got is not None:
            return got
        if c == "0":
            return _I_LIT, int("0" + self.getwhile(2, _OCTDIGITS), 8)
        if c in _DIGITS:
            digits = c
            if self.i < self.n and self.p[self.i] in _DIGITS:
                digits += self.p[self.i]
                self.i += 1
                if (
                    digits[0] in _OCTDIGITS
                    and digits[1] in _OCTDIGITS
                    and self.i < self.n
                    and self.p[self.i] in _OCTDIGITS
                ):
                    digits += self.p[self.i]
                    self.i += 1
                    value = int(digits, 8)
                    if value > 0o377:
                        raise _Bad
                    return _I_LIT, value
            group = int(digits)
            if group < len(self.closed):
                if not self.checkgroup(group):
                    raise _Bad
                self.checklookbehindgroup(group)
                return _I_GROUPREF, group
            raise _Bad
        if c in _ASCIILETTERS:
            raise _Bad
        return _I_LIT, ord(c)

    def class_escape(self, c: str) -> tuple[Any, ...]:
        """An escape inside a class: a literal, or ``(_I_IN, ((2, letter),))``."""
        code = _ESCAPES.get(c)
        if code is not None:
            return _I_LIT, code
        if c in _CLASS_CATEGORIES:
            return _IN_ESCAPES[c]
        got = self._common_escape(c)
        if got is not None:
            return got
        if c in _OCTDIGITS:
            value = int(c + self.getwhile(2, _OCTDIGITS), 8)
            if value > 0o377:
                raise _Bad
            return _I_LIT, value
        if c in _DIGITS or c in _ASCIILETTERS:
            raise _Bad
        return _I_LIT, ord(c)

    def char_class(self) -> tuple[Any, ...]:
        """``[...]``, the ``[`` read; the item is cached by the class's text."""
        start = self.i - 1
        m = _CLASS_EXTENT.match(self.p, start)
        text = m.group() if m is not None else None
        if text is not None:
            got = _CLASS_CACHE.get(text)
            if got is not None:
                self.i = m.end()  # type: ignore[union-attr]
                return got
        item = self._read_class()
        if text is not None and self.i == start + len(text):
            if len(_CLASS_CACHE) >= 2048:
                _CLASS_CACHE.clear()
            _CLASS_CACHE[text] = item
        return item

    def _read_class(self) -> tuple[Any, ...]:
        negate = self.match("^")
        members: list[tuple[Any, ...]] = []
        while True:
            this = self.get()
            if this is None:
                raise _Bad
            if this == "]" and members:
                break
            code1 = self.class_escape(this[1]) if this[0] == "\\" else (_I_LIT, ord(this))
            if self.match("-"):
                that = self.get()
                if that is None:
                    raise _Bad
                if that == "]":
                    members.append(code1[1][0] if code1[0] == _I_IN else (0, code1[1]))
                    members.append((0, 45))
                    break
                code2 = self.class_escape(that[1]) if that[0] == "\\" else (_I_LIT, ord(that))
                if code1[0] != _I_LIT or code2[0] != _I_LIT or code2[1] < code1[1]:
                    raise _Bad
                members.append((1, code1[1], code2[1]))
            else:
                members.append(code1[1][0] if code1[0] == _I_IN else (0, code1[1]))
        uniq = tuple(dict.fromkeys(members))
        if len(uniq) == 1 and uniq[0][0] == 0:
            return (_I_NOT_LIT if negate else _I_LIT), uniq[0][1]
        return _I_IN, ((_NEGATE, *uniq) if negate else uniq)

    # -- flags -------------------------------------------------------------------------------------

    def parse_flags(self, char: str | None) -> tuple[int, int] | None:
        add = 0
        delete = 0
        if char != "-":
            while True:
                flag = _FLAGS[char]  # type: ignore[index]
                if char == "L":
                    raise _Bad
                add |= flag
                if (flag & _TYPE_FLAGS) and (add & _TYPE_FLAGS) != flag:
                    raise _Bad
                char = self.get()
                if char is None:
                    raise _Bad
                if char in (")", "-", ":"):
                    break
                if char not in _FLAGS:
                    raise _Bad
        if char == ")":
            self.flags |= add
            return None
        if add & _GLOBAL_FLAGS:
            raise _Bad
        if char == "-":
            char = self.get()
            if char is None or char not in _FLAGS:
                raise _Bad
            while True:
                flag = _FLAGS[char]
                if flag & _TYPE_FLAGS:
                    raise _Bad
                delete |= flag
                char = self.get()
                if char is None:
                    raise _Bad
                if char == ":":
                    break
                if char not in _FLAGS:
                    raise _Bad
        if delete & _GLOBAL_FLAGS or add & delete:
            raise _Bad
        return add, delete

    # -- the grammar -------------------------------------------------------------------------------

    def parse_sub(self, verbose: int, nested: int) -> list[tuple[Any, ...]]:
        if nested > 2 * MAX_DEPTH:  # two levels per group, as in re._parser
            raise _Bad
        branches: list[list[tuple[Any, ...]]] = []
        while True:
            branches.append(self.parse(verbose, nested + 1, not nested and not branches))
            if not self.match("|"):
                break
            if not nested:
                verbose = self.flags & _VERBOSE
        if len(branches) == 1:
            return branches[0]
        out: list[tuple[Any, ...]] = []
        # a prefix common to every branch is factored out
        while True:
            prefix = None
            for items in branches:
                if not items:
                    break
                if prefix is None:
                    prefix = items[0]
                elif items[0] != prefix:
                    break
            else:
                for items in branches:
                    del items[0]
                out.append(prefix)  # type: ignore[arg-type]
                continue
            break
        # branches of one literal or class each are one class
        members: list[tuple[Any, ...]] = []
        for items in branches:
            if len(items) != 1:
                break
            item = items[0]
            if item[0] == _I_LIT:
                members.append((0, item[1]))
            elif item[0] == _I_IN and item[1][0] != _NEGATE:
                members.extend(item[1])
            else:
                break
        else:
            out.append((_I_IN, tuple(dict.fromkeys(members))))
            return out
        out.append((_I_BRANCH, next(_SERIAL), branches))
        return out

    def parse(self, verbose: int, nested: int, first: bool = False) -> list[tuple[Any, ...]]:
        p, n = self.p, self.n
        items: list[tuple[Any, ...]] = []
        append = items.append
        while self.i < n:
            c = p[self.i]
            if c == "|" or c == ")":
                break
            if c not in _SPECIAL and not (verbose and (c in _WHITESPACE or c == "#")):
                m = (_RUN_VERBOSE if verbose else _RUN).match(p, self.i)
                run = m.group()  # type: ignore[union-attr]
                self.i += len(run)
                items.extend(map(_lit_item, run))
                continue
            self.i += 1
            if verbose and c in _WHITESPACE:
                continue
            if verbose and c == "#":
                self.i = min(n, _COMMENT.match(p, self.i).end() + 1)  # type: ignore[union-attr]
                continue
            if c == "\\":
                if self.i >= n:
                    raise _Bad  # a trailing backslash
                e = p[self.i]
                self.i += 1
                append(self.escape(e))
            elif c == "[":
                append(self.char_class())
            elif c in "*+?{":
                self.repeat(c, items)
            elif c == ".":
                append(_ANY_ITEM)
            elif c == "(":
                if self.group(verbose, nested, first, items):
                    verbose = self.flags & _VERBOSE
            elif c == "^":
                append((_I_AT, "^"))
            else:  # "$"
                append((_I_AT, "$"))
        # non-capturing groups without flags are spliced into the sequence
        if any(
            item[0] == _I_SUB and item[2] is None and not item[3] and not item[4] for item in items
        ):
            flat: list[tuple[Any, ...]] = []
            for item in items:
                if item[0] == _I_SUB and item[2] is None and not item[3] and not item[4]:
                    flat.extend(item[5])
                else:
                    flat.append(item)
            return flat
        return items

    def repeat(self, c: str, items: list[tuple[Any, ...]]) -> None:
        p = self.p
        if c == "?":
            lo, hi = 0, 1
        elif c == "*":
            lo, hi = 0, _MAXREPEAT
        elif c == "+":
            lo, hi = 1, _MAXREPEAT
        else:  # "{"
            here = self.i
            if self.i < self.n and p[self.i] == "}":
                items.append(_lit_item("{"))
                return
            lo_s = self.getwhile(self.n, _DIGITS)
            hi_s = self.getwhile(self.n, _DIGITS) if self.match(",") else lo_s
            if not self.match("}"):
                items.append(_lit_item("{"))
                self.i = here
                return
            lo, hi = 0, _MAXREPEAT
            if lo_s:
                lo = int(lo_s)
                if lo >= _MAXREPEAT:
                    raise _Bad
            if hi_s:
                hi = int(hi_s)
                if hi >= _MAXREPEAT or hi < lo:
                    raise _Bad
        if not items or items[-1][0] == _I_AT or items[-1][0] == _I_REPEAT:
            raise _Bad  # nothing to repeat, or a repeat of a repeat
        item = items[-1]
        if item[0] == _I_SUB and item[2] is None and not item[3] and not item[4]:
            body = item[5]
        else:
            body = [item]
        # a lazy "?" or possessive "+" modifier changes nothing the models read
        if not self.match("?"):
            self.match("+")
        items[-1] = (_I_REPEAT, next(_SERIAL), lo, hi, body)

    def group(self, verbose: int, nested: int, first: bool, items: list[tuple[Any, ...]]) -> bool:
        """``(...)``, the ``(`` read: appends its item (if any); True when it was global flags
        (``(?x)``: the caller's branch reads verbosely from here)."""
        capture = True
        atomic = False
        name = None
        add = delete = 0
        if self.match("?"):
            char = self.get()
            if char is None:
                raise _Bad
            if char == "P":
                if self.match("<"):
                    name = self.getuntil(">")
                    if not name.isidentifier():
                        raise _Bad
                elif self.match("="):
                    name = self.getuntil(")")
                    if not name.isidentifier():
                        raise _Bad
                    gid = self.names.get(name)
                    if gid is None or not self.checkgroup(gid):
                        raise _Bad
                    self.checklookbehindgroup(gid)
                    items.append((_I_GROUPREF, gid))
                    return False
                else:
                    raise _Bad
            elif char == ":":
                capture = False
            elif char == "#":
                while True:
                    tok = self.get()
                    if tok is None:
                        raise _Bad
                    if tok == ")":
                        return False
            elif char in ("=", "!", "<"):
                behind = char == "<"
                saved = self.lookbehind
                if behind:
                    char = self.get()
                    if char not in ("=", "!"):
                        raise _Bad
                    if saved is None:
                        self.lookbehind = len(self.closed)
                self.parse_sub(verbose, nested + 1)
                if behind and saved is None:
                    self.lookbehind = None
                if not self.match(")"):
                    raise _Bad
                items.append((_I_ASSERT, next(_SERIAL)))
                return False
            elif char == "(":
                self.condition()
                self.parse(verbose, nested + 1)
                if self.match("|"):
                    self.parse(verbose, nested + 1)
                    if self.i < self.n and self.p[self.i] == "|":
                        raise _Bad
                if not self.match(")"):
                    raise _Bad
                items.append((_I_COND, next(_SERIAL)))
                return False
            elif char == ">":
                capture = False
                atomic = True
            elif char in _FLAGS or char == "-":
                flags = self.parse_flags(char)
                if flags is None:  # global flags
                    if not first or items:
                        raise _Bad
                    return True
                add, delete = flags
                capture = False
            else:
                raise _Bad
        gid = None
        if capture:
            gid = len(self.closed)
            self.closed.append(False)
            if gid > _MAXGROUPS:
                raise _Bad
            if name is not None:
                if name in self.names:
                    raise _Bad
                self.names[name] = gid
        sub_verbose = (verbose or (add & _VERBOSE)) and not (delete & _VERBOSE)
        body = self.parse_sub(sub_verbose, nested + 1)
        if not self.match(")"):
            raise _Bad
        if gid is not None:
            self.closed[gid] = True
        if atomic:
            items.append((_I_ATOMIC, next(_SERIAL), body))
        else:
            items.append((_I_SUB, next(_SERIAL), gid, add, delete, body))
        return False

    def condition(self) -> None:
        name = self.getuntil(")")
        if name.isidentifier():
            gid = self.names.get(name)
            if gid is None:
                raise _Bad
        else:
            try:
                gid = int(name)
            except ValueError:
                raise _Bad from None
            if gid <= 0 or gid >= _MAXGROUPS:
                raise _Bad
            self.refpos.add(gid)
        self.checklookbehindgroup(gid)


def _read(pattern: str) -> tuple[list[tuple[Any, ...]], int]:
    """The items of ``pattern`` and its global flags, as re._parser reads them; :class:`_Bad`
    when it would refuse the pattern."""
    if pattern.endswith("\\") and (len(pattern) - len(pattern.rstrip("\\"))) % 2:
        raise _Bad  # a trailing backslash
    r = _Reader(pattern)
    items = r.parse_sub(0, 0)
    flags = r.flags
    if not flags & _ASCII_FLAG:
        flags |= _UNICODE_FLAG
    elif flags & _UNICODE_FLAG:
        raise _Bad
    if r.i < r.n:
        raise _Bad  # an unbalanced ")"
    if any(g >= len(r.closed) for g in r.refpos):
        raise _Bad
    return items, flags


# ---- items to nodes ---------------------------------------------------------------------------

_LIT_NODES: dict[tuple[int, bool], Node] = {}
_IN_CS: dict[tuple[Any, bool], int] = {}


def _count(value: int) -> int | None:
    return None if value >= _MAXREPEAT else min(value, _MAX_COUNT)


def _in_cs(members: tuple[Any, ...], fold: bool) -> int:
    key = (members, fold)
    got = _IN_CS.get(key)
    if got is not None:
        return got
    neg = False
    acc = 0
    for m in members:
        tag = m[0]
        if tag == 3:
            neg = True
        elif tag == 0:
            s = _rng(m[1], m[1])
            acc |= _fold(s) if fold else s
        elif tag == 1:
            acc |= _rng(m[1], m[2])
            if fold:
                acc = _fold(acc)
        else:
            acc |= _CATEGORY_CS[m[1]]
    cs = _invert(acc) if neg else acc
    if len(_IN_CS) >= 2048:
        _IN_CS.clear()
    _IN_CS[key] = cs
    return cs


def _lit_cp(cp: int, fold: bool) -> Node:
    key = (cp, fold)
    node = _LIT_NODES.get(key)
    if node is None:
        s = _rng(cp, cp)
        node = _lit(_fold(s) if fold else s)
        if len(_LIT_NODES) >= 4096:
            _LIT_NODES.clear()
        _LIT_NODES[key] = node
    return node


def _build(items: list[tuple[Any, ...]], flags: int) -> Node:
    """The node of a sequence of items: runs of the same atom merged into one count, nested
    sequences spliced in, empty nodes dropped (``_canon_cat`` of the reference)."""
    fold = bool(flags & _IGNORECASE)
    out: list[Node] = []
    run_base: Node | None = None  # the atom of the run being merged
    run_node: Node | None = None  # its first node, kept as is when the run has one
    run_lo = 0
    run_hi: int | None = 0
    run_n = 0
    lit_nodes = _LIT_NODES
    for item in items:
        op = item[0]
        if op == _I_LIT:
            node = lit_nodes.get((item[1], fold)) or _lit_cp(item[1], fold)
            # the common case, a literal after a literal: merged when they are the same
            if run_n and run_base is not None and run_base.kind == LIT:
                if run_base is node or run_base.cs == node.cs:
                    run_lo = min(run_lo + 1, _MAX_COUNT)
                    run_hi = None if run_hi is None else min(run_hi + 1, _MAX_COUNT)
                    run_n += 1
                    continue
                out.append(run_node if run_n == 1 else _rep(run_base, run_lo, run_hi))  # type: ignore[arg-type]
                run_base, run_node, run_lo, run_hi, run_n = node, node, 1, 1, 1
                continue
        elif op == _I_IN:
            node = _lit(_in_cs(item[1], fold))
        elif op == _I_ANY:
            node = _lit(ANY_CS if flags & _DOTALL else _DOT)
        elif op == _I_NOT_LIT:
            node = _lit(_invert(_rng(item[1], item[1])))
        elif op == _I_REPEAT:
            node = _rep(_build(item[4], flags), _count(item[2]) or 0, _count(item[3]))
        elif op == _I_SUB:
            node = _build(item[5], (flags | item[3]) & ~item[4])
        elif op == _I_BRANCH:
            node = _alt([_build(b, flags) for b in item[2]])
        elif op == _I_AT:
            if item[1] in ("b", "B"):
                raise Unpriceable("word boundary")
            continue
        elif op == _I_ATOMIC:
            node = _build(item[2], flags)
        elif op == _I_ASSERT:
            raise Unpriceable("look-around")
        else:  # group references, conditionals
            raise Unpriceable("back-reference")
        kind = node.kind
        if kind == EPS:
            continue
        for it in node.kids if kind == CAT else (node,):
            if it.kind == REP:
                base, lo, hi = it.kids[0], it.lo, it.hi
            else:
                base, lo, hi = it, 1, 1
            if (
                run_n and (base.kind == LIT or base.kind == ALT) and _same(run_base, base)  # type: ignore[arg-type]
            ):
                run_lo = min(run_lo + lo, _MAX_COUNT)
                run_hi = None if run_hi is None or hi is None else min(run_hi + hi, _MAX_COUNT)
                run_n += 1
                continue
            if run_n:
                out.append(run_node if run_n == 1 else _rep(run_base, run_lo, run_hi))  # type: ignore[arg-type]
            run_base, run_node, run_lo, run_hi, run_n = base, it, lo, hi, 1
    if run_n:
        out.append(run_node if run_n == 1 else _rep(run_base, run_lo, run_hi))  # type: ignore[arg-type]
    if not out:
        return _EPS_NODE
    if len(out) == 1:
        return out[0]
    return _cat(out)


_CLASS_SPECIALS = re.compile(r"[\\\[\]&~-]")


def rust_reads_differently(pattern: str) -> bool:
    """An unescaped ``[`` inside a class, or ``&&`` / ``--`` / ``~~`` there: Rust's regex
    (outlines-core, llguidance) reads nested classes and set operations where Python's parser
    reads literals (``[a-z["a"]"b"]{83,}`` is one wide class counted 83 times in Rust, a class
    then ``"b"]{83,}`` here: 1.1 s at 32k estimated as 0.3 s). Linear; plain text is skipped
    by one C-level search."""
    depth = start = 0
    n = len(pattern)
    search = _CLASS_SPECIALS.search
    m = search(pattern, 0)
    while m is not None:
        i = m.start()
        c = pattern[i]
        if c == "\\":
            i += 2
        elif depth:
            if c == "[":
                return True
            if c == "]" and i > start:
                depth = 0
            elif pattern.startswith(("&&", "--", "~~"), i) and i > start:
                return True
            i += 1
        elif c == "[":
            depth = 1
            start = i + 1
            if pattern.startswith("^", start):
                start += 1
            if pattern.startswith("]", start):
                start += 1  # a leading ] is a literal
            i = start
        else:
            i += 1
        if i >= n:
            break
        m = search(pattern, i)
    return False


def parse_regex(pattern: str) -> Node:
    """The pattern's AST with attributes; :class:`Unpriceable` when it cannot be priced (or
    Python's parser does not read it: Rust-only syntax such as ``\\p{L}``). Linear in the
    pattern; not cached (the callers cache what they compute from it, which is small)."""
    if rust_reads_differently(pattern):
        raise Unpriceable("a class that Rust's regex reads as nested classes or set operations")
    try:
        items, flags = _read(pattern)
    except (_Bad, RecursionError):
        raise Unpriceable("not readable") from None
    return _build(items, flags)

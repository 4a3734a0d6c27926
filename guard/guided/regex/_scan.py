"""A one-pass structural scan of a regex, run before any engine compiles it.

The scan reads the pattern once, left to right, with an explicit stack of open groups (no
recursion), and summarises every piece by a few numbers: which characters can start, end,
appear in or must appear in a match (192-bit masks), whether it can match empty, its length
range, an estimate of its RE2 program size and the product of the repetition counts above it.
From those it refuses, with a short reason and never an echo of the pattern:

- group nesting deeper than a cap (grammar converters recurse once per group);
- repetition products over a cap (``a{100}{100}{100}``, ``(a{50}){50}``) and an estimated
  compiled size over a cap (which also bounds the time RE2 then spends compiling it);
- ambiguous repetition, the shape behind catastrophic backtracking. Ambiguous pieces are
  recorded as they are read and checked against every repetition that encloses them:
  a variable-length piece whose characters can both end one iteration and start the next
  (``(a+)+``, ``(a*)*b``, ``(.*a){20}``, ``(a|aa)*``); an alternation whose branches can match
  the same text (``(a|a)*``; judged by first, last and required characters and length range);
  an optional piece that can itself match empty (``(a()?)+``); two adjacent variable-length
  pieces that can trade characters (``(b*b*a)*``). An unbounded such piece refuses under any
  outer count above 1 (nested quantifiers); bounded ones once the ways to split the same text
  (choices ** outer counts, multiplied over the pattern) pass a cap, so that
  ``((25[0-5]|2[0-4]\\d|[01]?\\d\\d?)\\.){3}`` (27 ways) is fine;
- runs of adjacent unbounded pieces that share characters (``.*.*.*.*.*=``), polynomial.

Character sets are over-approximated (bits 0-127 ASCII, bit 191 non-ASCII whitespace, bits
128-190 other code points by ``cp % 63``): a larger set can only make the scan refuse more.
The scan is a heuristic on the safe side, not a decision procedure: unambiguous patterns with
overlapping character sets (``(a+ba)+``) are refused too, and an exotic ambiguity it does not
model may pass (RE2 itself matches in linear time whatever the pattern).

Constructs that different engines read differently are refused as invalid rather than guessed:
``[]`` / ``[^]`` (empty class in JavaScript, literal ``]`` elsewhere), ``\\Q...\\E`` and
``\\x{...}`` (RE2/PCRE only; JavaScript reads ``x{41}`` as a repetition). Everything else that
is odd is left for RE2 to reject; the scan never raises anything but :class:`RegexRejected`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import NamedTuple, NoReturn

from guard.errors import RegexRejected
from guard.guided._limits import GuidedLimits

INVALID = "guided_regex_invalid"
UNSAFE = "guided_regex_unsafe"


@dataclass(frozen=True)
class ScanResult:
    est_program_size: int
    max_repeat_product: int
    max_nesting: int


# ---- character sets -------------------------------------------------------------------------

_NONASCII = ((1 << 64) - 1) << 128
_ALL = (1 << 192) - 1
_ASCII = (1 << 128) - 1
_UPPER = ((1 << 26) - 1) << 65
_LOWER = ((1 << 26) - 1) << 97


_UNICODE_SPACES = frozenset(
    [0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000, 0xFEFF]
)
_SPACE_BIT = 1 << 191


def _bit(cp: int) -> int:
    if cp < 128:
        return 1 << cp
    if cp in _UNICODE_SPACES:
        return _SPACE_BIT
    return 1 << (128 + cp % 63)


def _range(lo: int, hi: int) -> int:
    if hi < lo:
        lo, hi = hi, lo
    mask = 0
    if lo < 128:
        top = min(hi, 127)
        mask = ((1 << (top + 1)) - 1) ^ ((1 << lo) - 1)
    if hi >= 128:
        start = max(lo, 128)
        if hi - start >= 62:
            mask |= _NONASCII & ~_SPACE_BIT
            if any(start <= cp <= hi for cp in _UNICODE_SPACES):
                mask |= _SPACE_BIT
        else:
            for cp in range(start, hi + 1):
                mask |= _bit(cp)
    return mask


def _chars(text: str | set[str]) -> int:
    mask = 0
    for ch in text:
        mask |= _bit(ord(ch))
    return mask


def _fold(mask: int) -> int:
    # ASCII letters fold across case (32 apart); any non-ASCII bit may fold anywhere.
    mask |= ((mask & _UPPER) << 32) | ((mask & _LOWER) >> 32)
    if mask & _NONASCII:
        mask |= _NONASCII
    return mask


_DIGIT = _range(48, 57)
_WORD = _DIGIT | _range(65, 90) | _range(97, 122) | _bit(95) | (_NONASCII & ~_SPACE_BIT)
_SPACE = _chars(" \t\n\v\f\r") | _SPACE_BIT
_POSIX = {
    "alnum": _DIGIT | _range(65, 90) | _range(97, 122),
    "alpha": _range(65, 90) | _range(97, 122),
    "ascii": _ASCII,
    "blank": _chars(" \t"),
    "cntrl": _range(0, 31) | _bit(127),
    "digit": _DIGIT,
    "graph": _range(33, 126),
    "lower": _range(97, 122),
    "print": _range(32, 126),
    "punct": _range(33, 47) | _range(58, 64) | _range(91, 96) | _range(123, 126),
    "space": _chars(" \t\n\v\f\r"),
    "upper": _range(65, 90),
    "word": _DIGIT | _range(65, 90) | _range(97, 122) | _bit(95),
    "xdigit": _DIGIT | _range(65, 70) | _range(97, 102),
}
_SIMPLE_ESCAPES = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "a": 7, "e": 27, "0": 0}
_ZERO_WIDTH_ESCAPES = frozenset("bBAzZG<>")
_HEX = frozenset("0123456789abcdefABCDEF")
_DIGITS = frozenset("0123456789")
# Estimated RE2 program sizes (instructions), measured with google-re2: an empty program is 4,
# ``\d`` adds 1, ``\s`` 3, ``\W`` 11, ``.`` 8, ``\pN`` 233, ``\p{Lu}`` 790, ``\pL`` 1196.
_W_UNICODE_CLASS = 1300
_W_NEGATED = 12
_W_BASE = 4
_FOLDS_OUTSIDE_ASCII = frozenset(map(ord, "kKsS"))
# Repetition counts are saturated here; RE2 refuses anything above 1000 anyway.
_NUM_CAP = 1 << 20
# Characters with no meaning of their own in any supported dialect.
_PLAIN_RUN = re.compile(r"[^\\\[\](){}|*+?.^$]+")


class _Chain(NamedTuple):
    """A run of adjacent variable-length pieces: the characters all of them can match, the
    first and last characters of the latest one, how many (unbounded ones among them), the
    lowest group depth since the latest one, and whether the latest one is unbounded."""

    chars: int
    first: int
    last: int
    k: int
    unbounded_count: int
    low: int
    unbounded: bool


_NO_CHAIN = _Chain(0, 0, 0, 0, 0, 0, False)


# ---- parse state ----------------------------------------------------------------------------


class _Item:
    """A variable-length or ambiguous piece, waiting to be checked against enclosing repeats.

    ``alt`` pieces are ambiguous by themselves (overlapping alternation, an optional piece that
    matches empty, two adjacent pieces that trade characters); the others only if they can
    reach across an iteration boundary of the enclosing repeat."""

    __slots__ = ("alt", "armed", "bits", "chars", "mult", "unbounded")

    def __init__(self, chars: int, unbounded: bool, alt: bool, options: int) -> None:
        self.chars = chars
        self.unbounded = unbounded
        self.alt = alt
        self.bits = math.log2(max(options, 2))  # choices per occurrence
        self.armed = False
        self.mult = 1  # occurrences once armed: the product of the enclosing counts


class _Elem:
    """Summary of a parsed atom or group, still open to a following quantifier."""

    __slots__ = (
        "chain",
        "chars",
        "first",
        "items",
        "last",
        "maxlen",
        "minlen",
        "need",
        "nullable",
        "product",
        "quantified",
        "size",
        "transparent",
    )

    def __init__(self, mask: int, size: int, width: int) -> None:
        self.first = mask
        self.last = mask
        self.chars = mask
        # every match contains one of these characters (_ALL: no such guarantee)
        self.need = mask if width else _ALL
        self.nullable = width == 0
        self.minlen = width
        self.maxlen: int | None = width
        self.size = size
        self.product = 1
        self.items: list[_Item] = []
        self.quantified = False
        self.transparent = False  # a plain group: the adjacency chain runs through it
        self.chain = _NO_CHAIN


class _GroupFrame:
    """An open group: the alternation finished so far plus the current branch."""

    __slots__ = (
        "a_chars",
        "a_first",
        "a_last",
        "a_max",
        "a_min",
        "a_need",
        "a_nullable",
        "a_size",
        "branches",
        "capture",
        "chain",
        "chain_in",
        "first_overlap",
        "items",
        "pending",
        "product",
        "s_chars",
        "s_first",
        "s_last",
        "s_max",
        "s_min",
        "s_need",
        "s_nullable",
        "s_size",
        "shape_overlap",
        "zero_width",
    )

    def __init__(self, capture: bool, zero_width: bool, chain: _Chain) -> None:
        self.capture = capture
        self.zero_width = zero_width
        self.branches = 0
        self.a_first = self.a_last = self.a_chars = 0
        self.a_need = 0
        self.a_nullable = False
        self.a_min = 0
        self.a_max: int | None = 0
        self.a_size = 0
        self.first_overlap = False
        self.shape_overlap = False
        self.items: list[_Item] = []
        self.product = 1
        self.pending: _Elem | None = None
        self.chain_in = self.chain = chain
        self._reset_branch()

    def _reset_branch(self) -> None:
        self.s_first = self.s_last = self.s_chars = 0
        self.s_need = _ALL
        self.s_nullable = True
        self.s_min = 0
        self.s_max: int | None = 0
        self.s_size = 0


def _add(a: int | None, b: int | None) -> int | None:
    if a is None or b is None:
        return None
    return min(a + b, _NUM_CAP)


class _RegexScanner:
    def __init__(self, pattern: str, limits: GuidedLimits) -> None:
        self.p = pattern
        self.n = len(pattern)
        self.limits = limits
        self.fold = _has_fold_flag(pattern)
        self.max_bits = math.log2(max(limits.max_regex_ambiguous_ways, 1))
        self.stack: list[_GroupFrame] = [_GroupFrame(False, False, _NO_CHAIN)]
        self.max_product = 1
        self.max_depth = 0

    # -- elements ------------------------------------------------------------------------------

    def _literal(self, cp: int) -> _Elem:
        mask = _bit(cp)
        if self.fold:
            mask = _fold(mask)
        size = 1 if cp < 128 else (2 if cp < 0x800 else 3 if cp < 0x10000 else 4)
        if self.fold and cp in _FOLDS_OUTSIDE_ASCII:
            size = 4
        return _Elem(mask, size, 1)

    def _class_elem(self, mask: int, size: int) -> _Elem:
        if self.fold:
            mask = _fold(mask)
            size = size * 3 + 4  # case folding splits ranges (k and s also fold to U+212A, U+017F)
        return _Elem(mask, size, 1)

    def _commit(self, frame: _GroupFrame) -> None:
        """Append the pending element to the current branch of ``frame``."""
        e = frame.pending
        if e is None:
            return
        frame.pending = None
        if frame.s_nullable:
            frame.s_first |= e.first
        frame.s_last = e.last | (frame.s_last if e.nullable else 0)
        frame.s_nullable = frame.s_nullable and e.nullable
        frame.s_chars |= e.chars
        if not e.nullable and e.need.bit_count() < frame.s_need.bit_count():
            frame.s_need = e.need
        frame.s_min = min(frame.s_min + e.minlen, _NUM_CAP)
        frame.s_max = _add(frame.s_max, e.maxlen)
        frame.s_size += e.size
        if e.product > frame.product:
            frame.product = e.product
        if e.items:
            frame.items.extend(e.items)
        self._chain(frame, e)

    def _chain(self, frame: _GroupFrame, e: _Elem) -> None:
        """Follow runs of adjacent variable-length pieces that can trade characters (``b*b*``,
        ``.*a.*``): each such pair is an ambiguity, and a long run of unbounded ones is a
        polynomial blow-up by itself."""
        depth = len(self.stack) - 1
        chain = frame.chain
        if e.transparent and not e.quantified:
            chain = e.chain
            frame.chain = chain if chain.low <= depth else chain._replace(low=depth)
        elif e.chars and e.minlen != e.maxlen:
            unbounded = e.maxlen is None
            if chain.k and chain.chars & e.chars and chain.first & e.first and chain.last & e.last:
                # The pair lies inside every group that holds both pieces: the innermost one
                # is the frame at the lowest depth seen since the previous piece.
                both_unbounded = chain.unbounded and unbounded
                self.stack[min(chain.low, depth)].items.append(
                    _Item(chain.chars & e.chars, both_unbounded, True, 2)
                )
                frame.chain = _Chain(
                    chain.chars & e.chars,
                    e.first,
                    e.last,
                    chain.k + 1,
                    chain.unbounded_count + unbounded,
                    depth,
                    unbounded,
                )
            elif chain.k and e.nullable:
                # an optional piece that does not pair: the run may skip it or start at it
                frame.chain = _Chain(
                    chain.chars | e.chars,
                    chain.first | e.first,
                    chain.last | e.last,
                    chain.k,
                    max(chain.unbounded_count, int(unbounded)),
                    depth,
                    chain.unbounded or unbounded,
                )
            else:
                frame.chain = _Chain(e.chars, e.first, e.last, 1, int(unbounded), depth, unbounded)
            if frame.chain.unbounded_count > self.limits.max_regex_adjacent_unbounded:
                raise RegexRejected(
                    UNSAFE,
                    f"more than {self.limits.max_regex_adjacent_unbounded} adjacent unbounded "
                    "repetitions can match the same characters (polynomial backtracking)",
                )
        elif chain.k and not e.nullable:
            # a mandatory piece inside a run: backtracking still tries every split where the
            # run's pieces could match it, unless none of them can
            common = chain.chars & e.chars
            frame.chain = chain._replace(chars=common) if common else _NO_CHAIN

    def _finish_branch(self, frame: _GroupFrame) -> None:
        self._commit(frame)
        if frame.branches == 0:
            frame.a_first, frame.a_last, frame.a_chars = frame.s_first, frame.s_last, frame.s_chars
            frame.a_need = frame.s_need
            frame.a_nullable = frame.s_nullable
            frame.a_min, frame.a_max = frame.s_min, frame.s_max
            frame.a_size = frame.s_size
        else:
            if frame.s_first & frame.a_first:
                frame.first_overlap = True
                lo = max(frame.s_min, frame.a_min)
                hi_a, hi_s = frame.a_max, frame.s_max
                hi = hi_a if hi_s is None else hi_s if hi_a is None else min(hi_a, hi_s)
                if (
                    (hi is None or lo <= hi)
                    and frame.s_last & frame.a_last
                    and frame.s_need & frame.a_chars
                    and frame.a_need & frame.s_chars
                ):
                    frame.shape_overlap = True
            elif frame.s_nullable and frame.a_nullable:
                frame.shape_overlap = True  # two branches can both match the empty string
            frame.a_first |= frame.s_first
            frame.a_last |= frame.s_last
            frame.a_chars |= frame.s_chars
            frame.a_need |= frame.s_need
            frame.a_nullable = frame.a_nullable or frame.s_nullable
            frame.a_min = min(frame.a_min, frame.s_min)
            frame.a_max = (
                None
                if frame.a_max is None or frame.s_max is None
                else max(frame.a_max, frame.s_max)
            )
            frame.a_size += frame.s_size + 1
        frame.branches += 1
        frame._reset_branch()

    def _close(self, frame: _GroupFrame) -> _Elem:
        self._finish_branch(frame)
        if frame.zero_width:
            e = _Elem(0, frame.a_size + 2, 0)
            e.items = []  # a lookaround is matched in place, never repeated as text
            return e
        e = _Elem(0, frame.a_size + (2 if frame.capture else 0), 0)
        e.first, e.last, e.chars = frame.a_first, frame.a_last, frame.a_chars
        e.need = _ALL if frame.a_nullable else frame.a_need
        e.nullable = frame.a_nullable
        e.minlen, e.maxlen = frame.a_min, frame.a_max
        e.product = frame.product
        e.items = frame.items
        if frame.branches > 1:
            if frame.shape_overlap:
                e.items.append(_Item(e.chars, False, True, frame.branches))
            elif e.chars and (e.nullable or (frame.first_overlap and e.minlen != e.maxlen)):
                e.items.append(_Item(e.chars, False, False, frame.branches))
        else:
            e.transparent = True
            e.chain = frame.chain
        return e

    def _repeat(self, e: _Elem, lo: int, hi: int | None) -> None:
        """Apply ``{lo,hi}`` (``hi`` None: unbounded) to the pending element ``e``."""
        limits = self.limits
        count = hi if hi is not None else max(lo, 1)
        e.product = min(e.product * max(count, 1), _NUM_CAP)
        if e.product > limits.max_regex_repeat_product:
            raise RegexRejected(
                UNSAFE,
                f"nested repetition counts multiply to more than {limits.max_regex_repeat_product}",
            )
        if e.product > self.max_product:
            self.max_product = e.product
        e.size = min(e.size * max(count, 1) + count + 2, _NUM_CAP)
        self._check_size(e.size)
        if hi is None and e.maxlen == 0:
            raise RegexRejected(
                UNSAFE, "an unbounded repetition of a group that only matches empty text"
            )
        outer = _NUM_CAP if hi is None else hi
        if outer > 1 and e.items:
            bits = 0.0
            for item in e.items:
                if not item.armed and (item.alt or (item.chars & e.first and item.chars & e.last)):
                    if item.unbounded:
                        raise RegexRejected(
                            UNSAFE,
                            "a repeated group contains an unbounded repetition that can also "
                            "match across iterations (nested quantifiers, as in (a+)+)",
                        )
                    item.armed = True
                if item.armed:
                    item.mult = min(item.mult * outer, _NUM_CAP)
                    bits += item.bits * item.mult
            if bits > self.max_bits:
                self._too_ambiguous()
        if hi is None or hi != lo:
            options = 2 if hi is None else hi - lo + 1
            if e.nullable:
                # an optional piece that can itself match empty: two ways to match nothing
                e.items.append(_Item(e.chars, False, True, options))
            if e.chars:
                e.items.append(_Item(e.chars, hi is None, False, options))
        e.quantified = True
        e.nullable = e.nullable or lo == 0
        if e.nullable:
            e.need = _ALL
        e.minlen = min(e.minlen * lo, _NUM_CAP)
        e.maxlen = None if hi is None or e.maxlen is None else min(e.maxlen * hi, _NUM_CAP)

    # -- lexing --------------------------------------------------------------------------------

    def _escape(self, i: int, in_class: bool) -> tuple[int, int, int, int]:
        """Read the escape at ``p[i] == '\\\\'``: (mask, size, width, next index).

        A single code point is returned as mask ``-1 - cp`` so that class ranges can use it.
        """
        p, n = self.p, self.n
        if i + 1 >= n:
            return -1 - 92, 1, 1, i + 1  # trailing backslash: RE2 refuses it
        c = p[i + 1]
        j = i + 2
        if c == "d":
            return _DIGIT, 1, 1, j
        if c == "D":
            return _ALL & ~_DIGIT, _W_NEGATED, 1, j
        if c == "w":
            return _WORD, 3, 1, j
        if c == "W":
            return _ALL & ~_WORD | _NONASCII, _W_NEGATED, 1, j
        if c == "s":
            return _SPACE, 3, 1, j
        if c == "S":
            return _ALL & ~_SPACE | _NONASCII, _W_NEGATED, 1, j
        if c in "pP":
            if j < n and p[j] == "{":
                close = p.find("}", j, j + 64)
                j = close + 1 if close >= 0 else j
            elif j < n:
                j += 1
            return _ALL, _W_UNICODE_CLASS, 1, j
        if c in _SIMPLE_ESCAPES:
            return -1 - _SIMPLE_ESCAPES[c], 1, 1, j
        if c == "x":
            if j < n and p[j] == "{":
                raise RegexRejected(
                    INVALID, "\\x{...} escapes are read differently by different regex engines"
                )
            if j + 1 < n and p[j] in _HEX and p[j + 1] in _HEX:
                return -1 - int(p[j : j + 2], 16), 1, 1, j + 2
            return -1 - ord("x"), 1, 1, j
        if c == "u" and j + 3 < n and all(ch in _HEX for ch in p[j : j + 4]):
            cp = int(p[j : j + 4], 16)
            return -1 - cp, 2 if cp < 0x800 else 3, 1, j + 4
        if c == "Q":
            raise RegexRejected(
                INVALID, "\\Q...\\E quoting is read differently by different regex engines"
            )
        if not in_class and c in _ZERO_WIDTH_ESCAPES:
            return 0, 1, 0, j
        if c == "c" and j < n:
            return -1 - (ord(p[j]) % 32), 1, 1, j + 1
        return -1 - ord(c), 1, 1, j

    def _char_class(self, i: int) -> tuple[int, int, int]:
        """Read ``[...]`` starting at ``p[i] == '['``: (mask, size, next index)."""
        p, n = self.p, self.n
        j = i + 1
        negated = j < n and p[j] == "^"
        if negated:
            j += 1
        if j < n and p[j] == "]":
            raise RegexRejected(
                INVALID,
                "a character class starting with ']' is read differently by different regex "
                "engines; escape it as \\]",
            )
        mask = 0
        size = 0
        while True:
            if j >= n:
                raise RegexRejected(INVALID, "unterminated character class")
            c = p[j]
            if c == "]":
                j += 1
                break
            if c == "[" and j + 1 < n and p[j + 1] == ":":
                close = p.find(":]", j + 2, j + 40)
                if close >= 0:
                    name = p[j + 2 : close]
                    inverted = name.startswith("^")
                    m = _POSIX.get(name.lstrip("^"), _ALL)
                    mask |= (_ALL & ~m | _NONASCII) if inverted else m
                    size += 2 if not inverted else _W_NEGATED
                    j = close + 2
                    continue
            # one member, possibly the start of a range
            if c == "\\":
                m, w, _, j = self._escape(j, True)
            else:
                m, w, j = -1 - ord(c), 1, j + 1
            if m < 0 and j + 1 < n and p[j] == "-" and p[j + 1] != "]":
                if p[j + 1] == "\\":
                    hi_m, _, _, k = self._escape(j + 1, True)
                else:
                    hi_m, k = -1 - ord(p[j + 1]), j + 2
                if hi_m < 0:
                    lo_cp, hi_cp = -1 - m, -1 - hi_m
                    mask |= _range(lo_cp, hi_cp)
                    size += 1 if max(lo_cp, hi_cp) < 128 else 4
                    j = k
                    continue
            if m < 0:
                cp = -1 - m
                mask |= _bit(cp)
                size += 1 if cp < 128 else 4
            else:
                mask |= m
                size += w
        if negated:
            mask = (_ALL & ~mask) | _NONASCII
            size += _W_NEGATED
        elif mask & _NONASCII:
            size += 4
        return mask, max(size, 1), j

    def _brace(self, i: int) -> tuple[int, int | None, int] | None:
        """Read ``{n}``, ``{n,}``, ``{n,m}`` or ``{,m}`` at ``p[i] == '{'``; None if literal."""
        p, n = self.p, self.n
        j = i + 1
        lo = 0
        has_lo = False
        while j < n and p[j] in _DIGITS:
            lo = min(lo * 10 + ord(p[j]) - 48, _NUM_CAP)
            has_lo = True
            j += 1
        if j < n and p[j] == "}":
            return (lo, lo, j + 1) if has_lo else None
        if j >= n or p[j] != ",":
            return None
        j += 1
        hi = 0
        has_hi = False
        while j < n and p[j] in _DIGITS:
            hi = min(hi * 10 + ord(p[j]) - 48, _NUM_CAP)
            has_hi = True
            j += 1
        if j >= n or p[j] != "}" or not (has_lo or has_hi):
            return None
        if not has_hi:
            return lo, None, j + 1
        return min(lo, hi), max(lo, hi), j + 1

    def _group_open(self, i: int) -> int:
        """Handle ``(`` at ``p[i]``: push a frame (or apply a flag group); return next index."""
        p, n = self.p, self.n
        j = i + 1
        capture = True
        zero_width = False
        if j < n and p[j] == "?":
            capture = False
            j += 1
            c = p[j] if j < n else ""
            if c in ("=", "!"):
                zero_width, j = True, j + 1
            elif c == "<" and j + 1 < n and p[j + 1] in "=!":
                zero_width, j = True, j + 2
            elif c in ("<", "'") or (c == "P" and j + 1 < n and p[j + 1] == "<"):
                end = ">" if c != "'" else "'"
                close = p.find(end, j + 1)
                if close < 0:
                    raise RegexRejected(INVALID, "unterminated group name")
                capture, j = True, close + 1
            elif (
                c in ("#", "P", "R", "&")
                or c in _DIGITS
                or (c in ("+", "-") and j + 1 < n and p[j + 1] in _DIGITS)
            ):
                # comments, backreferences and recursion: an opaque atom (RE2 refuses these)
                close = p.find(")", j)
                if close < 0:
                    raise RegexRejected(INVALID, "missing )")
                self._atom(_Elem(_ALL, 1, 1))
                return close + 1
            elif c in (":", ">", "|"):
                j += 1
            else:
                k = j
                while k < n and (p[k].isalpha() or p[k] in "-^"):
                    k += 1
                if k < n and p[k] == ")":
                    return k + 1  # a flag setting such as (?i): no group, no element
                if k < n and p[k] == ":":
                    j = k + 1
                # anything else is left for RE2 to refuse; scan it as a plain group
        parent = self.stack[-1]
        self._commit(parent)
        if len(self.stack) > self.limits.max_regex_nesting:
            raise RegexRejected(
                UNSAFE, f"groups are nested more than {self.limits.max_regex_nesting} deep"
            )
        self.stack.append(_GroupFrame(capture, zero_width, parent.chain))
        if len(self.stack) - 1 > self.max_depth:
            self.max_depth = len(self.stack) - 1
        return j

    def _atom(self, e: _Elem) -> None:
        frame = self.stack[-1]
        self._commit(frame)
        frame.pending = e

    def _quantifier(self, lo: int, hi: int | None, j: int) -> int:
        frame = self.stack[-1]
        e = frame.pending
        if e is None:
            # nothing to repeat ("*" at the start of a branch): RE2 refuses it
            self._atom(_Elem(_ALL, 1, 1))
            return j
        self._repeat(e, lo, hi)
        # a lazy or possessive modifier belongs to this quantifier
        if j < self.n and self.p[j] in "?+":
            j += 1
        return j

    def _too_ambiguous(self) -> NoReturn:
        raise RegexRejected(
            UNSAFE,
            f"repeated groups can match the same text in more than "
            f"{self.limits.max_regex_ambiguous_ways} ways (ambiguous alternation or optional part, "
            "as in (a|a)* or (a|aa)*)",
        )

    def _check_size(self, size: int) -> None:
        if size > self.limits.max_regex_program_size:
            raise RegexRejected(
                UNSAFE,
                f"the compiled pattern would exceed {self.limits.max_regex_program_size} instructions",
            )

    def _literal_run(self, i: int) -> int:
        """Append a run of plain characters at once (most of a typical pattern)."""
        m = _PLAIN_RUN.match(self.p, i)
        if m is None:  # a lone "]" or "}": literal
            self._atom(self._literal(ord(self.p[i])))
            return i + 1
        run = m.group()
        j = m.end()
        if j < self.n and self.p[j] in "*+?{":
            # the last character may be quantified: keep it as the pending element
            if len(run) > 1:
                self._append_run(run[:-1])
            self._atom(self._literal(ord(run[-1])))
        else:
            self._append_run(run)
        return j

    def _append_run(self, run: str) -> None:
        frame = self.stack[-1]
        self._commit(frame)
        mask = _chars(set(run))
        first, last = _bit(ord(run[0])), _bit(ord(run[-1]))
        if self.fold:
            mask, first, last = _fold(mask), _fold(first), _fold(last)
        if frame.s_nullable:
            frame.s_first |= first
        frame.s_last = last
        frame.s_nullable = False
        frame.s_chars |= mask
        if first.bit_count() < frame.s_need.bit_count():
            frame.s_need = first
        frame.s_min = min(frame.s_min + len(run), _NUM_CAP)
        frame.s_max = _add(frame.s_max, len(run))
        frame.s_size += len(run) if run.isascii() else len(run.encode("utf-8", "replace"))
        if frame.chain.k:
            common = frame.chain.chars
            for ch in set(run):
                common &= _fold(_bit(ord(ch))) if self.fold else _bit(ord(ch))
            frame.chain = frame.chain._replace(chars=common) if common else _NO_CHAIN

    def scan(self) -> ScanResult:
        p, n = self.p, self.n
        i = 0
        while i < n:
            c = p[i]
            if c == "\\":
                m, size, width, i = self._escape(i, False)
                if width == 0:
                    self._atom(_Elem(0, size, 0))
                elif m < 0:
                    self._atom(self._literal(-1 - m))
                else:
                    self._atom(self._class_elem(m, size))
            elif c == "[":
                m, size, i = self._char_class(i)
                self._atom(self._class_elem(m, size))
            elif c == "(":
                i = self._group_open(i)
            elif c == ")":
                i += 1
                if len(self.stack) > 1:
                    e = self._close(self.stack[-1])  # closed while on the stack: see _chain
                    self.stack.pop()
                    self._atom(e)
                else:
                    self._atom(_Elem(_bit(41), 1, 1))  # unbalanced: RE2 refuses it
            elif c == "|":
                i += 1
                frame = self.stack[-1]
                self._finish_branch(frame)
                frame.chain = frame.chain_in
            elif c == "*":
                i = self._quantifier(0, None, i + 1)
            elif c == "+":
                i = self._quantifier(1, None, i + 1)
            elif c == "?":
                i = self._quantifier(0, 1, i + 1)
            elif c == "{":
                brace = self._brace(i)
                if brace is None:
                    i += 1
                    self._atom(self._literal(123))
                else:
                    lo, hi, i = brace
                    i = self._quantifier(lo, hi, i)
            elif c == ".":
                i += 1
                self._atom(_Elem(_ALL, 8, 1))
            elif c in "^$":
                i += 1
                self._atom(_Elem(0, 1, 0))
            else:
                i = self._literal_run(i)
        if len(self.stack) > 1:
            raise RegexRejected(INVALID, "missing )")
        top = self.stack[0]
        self._finish_branch(top)
        # ambiguities multiply along a sequence too, not only under a repetition
        if sum(item.bits * item.mult for item in top.items if item.armed) > self.max_bits:
            self._too_ambiguous()
        self._check_size(top.a_size + _W_BASE)
        return ScanResult(
            est_program_size=top.a_size + _W_BASE,
            max_repeat_product=self.max_product,
            max_nesting=self.max_depth,
        )


def _has_fold_flag(pattern: str) -> bool:
    """Whether any inline flag group turns on case-insensitivity (then fold everywhere)."""
    i = pattern.find("(?")
    while i >= 0:
        j = i + 2
        while j < len(pattern) and pattern[j].isalpha():
            if pattern[j] == "i":
                return True
            j += 1
        i = pattern.find("(?", j)
    return False


def scan_regex(pattern: str, limits: GuidedLimits) -> ScanResult:
    """Scan ``pattern`` in one pass; raise :class:`RegexRejected` on the first problem."""
    return _RegexScanner(pattern, limits).scan()

"""Static cost estimates of what each structured-output backend does with a constraint.

One linear pass over the constraint (the regex AST of :mod:`guard.guided.regex._ast`, or the
JSON-schema tree) per backend; counted repetitions are priced symbolically, never unrolled. The
models and their constants come from measurements of the backends vLLM 0.32 installs
(outlines-core 0.2.14, xgrammar 0.2.8, llguidance 1.7.6) with byte-level BPE vocabularies of
2k, 4k and 32k tokens, one core (bench/README.md, "guided-decoding backends"). Each constant is
the largest measured ratio, so the estimates are upper fits: they over-estimate (refuse more),
never knowingly under-estimate a measured family.

- **outlines-core** determinises the regex (its own, or the one it derives from a schema) into a
  dense DFA, unanchored start included, then walks every vocabulary token from every anchored
  state. Time ~ vocabulary x anchored states + DFA states x NFA positions. States multiply by
  ``b ** n`` at a counted repetition ``X{m,n}`` that can be re-entered while an earlier entry is
  still inside it (``(a|b)*a(a|b){20}``, a bare JSON string with ``maxLength`` 20); broad classes
  cost ~7 states per count (UTF-8), Unicode categories ~24.
- **xgrammar** builds a token-mask cache per bounded repetition of a wide class (``.{0,1000}``,
  ``maxLength`` 300: ~1.5 s at 32k; no dearer past ~400 copies; one per distinct bounds of a
  schema's strings), is quadratic in enum values, choices, optional properties
  and grammar rules, and pays per decode token on nested ambiguous repetition
  (``(.{0,5}){0,5}``: 0.86 s per token).
- **llguidance** is lazy and fuel-limited: quadratic in GBNF rules, linear in ``maxItems`` and
  in counts over 10,000.
"""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from guard.guided.regex import (
    ALT,
    CAT,
    EPS,
    LIT,
    REP,
    Node,
    Unpriceable,
    ascii_printable,
    covers,
    meets,
    multibyte,
    parse_regex,
)
from guard.guided.schema import Memo, count_of, facts_of, resolve_ref

__all__ = [
    "Estimate",
    "guidance_cost",
    "outlines_cost",
    "trie_size",
    "xgrammar_cost",
]

_LOG2_CAP = 200.0
_INF = float("inf")


@dataclass
class Estimate:
    """One backend's estimated cost of one constraint: compile seconds (one core), peak memory
    growth in MiB, seconds per decode-step token mask, and why (the largest terms)."""

    compile_s: float = 0.0
    mem_mb: float = 0.0
    mask_s: float = 0.0
    why: list[str] = field(default_factory=list)
    accepted: bool = True  # False: the backend refuses the constraint (vLLM answers 400)


# ---- outlines: DFA states ---------------------------------------------------------------------


class _Src(NamedTuple):
    """A loop (or the implicit unanchored ``.*``) whose threads may linger and enter later."""

    key: int
    cls: int  # characters that keep the loop alive
    must: frozenset[int]  # classes every path from the loop to here consumes
    last: int  # characters the path may have consumed last
    direct: bool  # nothing consumed since the loop


_SRC_CAP = 6
_MUST_CAP = 16
_WEIGHT_CAP = 1e12


class _Acc:
    __slots__ = ("concurrent", "interval", "log2", "multibyte", "why")

    def __init__(self) -> None:
        self.log2 = 0.0
        self.multibyte = False
        self.why = ""
        self.interval = 0.0  # counts re-entered as an interval (linear, but each state twice)
        self.concurrent = 0.0  # log2 of the states multiplied by threads still before a count


def _consume(srcs: tuple[_Src, ...], cs: int) -> tuple[_Src, ...]:
    return tuple(
        _Src(
            s.key,
            s.cls,
            s.must if cs in s.must or len(s.must) >= _MUST_CAP else s.must | {cs},
            cs,
            False,
        )
        for s in srcs
    )


def _merge(groups: Sequence[tuple[_Src, ...]]) -> tuple[_Src, ...]:
    by_key: dict[int, _Src] = {}
    for srcs in groups:
        for s in srcs:
            old = by_key.get(s.key)
            if old is None:
                by_key[s.key] = s
            else:
                by_key[s.key] = _Src(
                    s.key, s.cls, old.must & s.must, old.last | s.last, old.direct or s.direct
                )
    return _cap(tuple(by_key.values()))


def _cap(srcs: tuple[_Src, ...]) -> tuple[_Src, ...]:
    """Keep the implicit start source and the most recent loops."""
    if len(srcs) <= _SRC_CAP:
        return srcs
    start = tuple(s for s in srcs if s.key == 0)
    rest = tuple(s for s in srcs if s.key != 0)
    return start + rest[-(_SRC_CAP - len(start)) :]


def _nlast_overlap(n: Node, entry: int) -> int:
    """Last leaves of one iteration whose class meets the entry characters."""
    if n.kind == LIT:
        return 1 if meets(n.cs, entry) else 0
    if n.kind == ALT:
        return sum(_nlast_overlap(k, entry) for k in n.kids)
    if n.kind == CAT:
        total = 0
        for k in reversed(n.kids):
            total += _nlast_overlap(k, entry)
            if not k.nullable:
                break
        return total
    if n.kind == REP:
        return _nlast_overlap(n.kids[0], entry)
    return 0


def _one_class(n: Node, cls: int) -> bool:
    """All leaves use one class inside ``cls`` (entering anywhere in a run of it is an
    interval of counts: linear)."""
    leaves: list[int] = []
    stack = [n]
    while stack:
        x = stack.pop()
        if x.kind == LIT:
            leaves.append(x.cs)
        stack.extend(x.kids)
    return bool(leaves) and all(c == leaves[0] for c in leaves) and covers(cls, leaves[0])


def _deterministic(n: Node) -> bool:
    """LL(1): every choice inside ``n`` is decided by the next character."""
    if n.kind in (LIT, EPS):
        return True
    if n.kind == ALT:
        if sum(k.nullable for k in n.kids) > 1:
            return False
        seen = 0
        for k in n.kids:
            if meets(seen, k.first):
                return False
            seen |= k.first
        return all(_deterministic(k) for k in n.kids)
    if n.kind == CAT:
        for i, k in enumerate(n.kids):
            if not _deterministic(k):
                return False
            if k.nullable or (k.kind == REP and k.hi != k.lo):
                follow = 0
                for r in n.kids[i + 1 :]:
                    follow |= r.first
                    if not r.nullable:
                        break
                if meets(k.last, follow) or meets(k.first, follow):
                    return False
        return True
    body = n.kids[0]
    return _deterministic(body) and not (n.hi != n.lo and body.nullable)


def _counts_wide(n: Node) -> bool:
    stack = [n]
    while stack:
        x = stack.pop()
        if x.kind == REP and max(x.lo, x.hi or 0) >= 2 and _wide_class(x.kids[0].chars):
            return True
        stack.extend(x.kids)
    return False


def _wide_class(cs: int) -> bool:
    return ascii_printable(cs) >= _BROAD_MIN or multibyte(cs)


def s_key_nonstart(srcs: tuple[_Src, ...]) -> bool:
    """Whether a real loop (not the implicit unanchored start) lingers here."""
    return any(s.key != 0 for s in srcs)


def _walk(n: Node, srcs: tuple[_Src, ...], acc: _Acc, weight: float) -> tuple[_Src, ...]:
    """Abstract interpretation of the determinisation: ``acc.log2`` collects ``log2`` of the
    state multiplier; ``weight`` is how many copies of ``n`` the automaton holds."""
    kind = n.kind
    if kind == EPS:
        return srcs
    if kind == LIT:
        return _consume(srcs, n.cs)
    if kind == CAT:
        for k in n.kids:
            srcs = _walk(k, srcs, acc, weight)
        return srcs
    if kind == ALT:
        # Branches that each count over a wide class run side by side: their count positions
        # combine (two {29,} letter branches behind wide loops: 1.02 s at 32k)
        counting = sum(1 for k in n.kids if _counts_wide(k))
        if counting >= 2:
            acc.concurrent += math.log2(counting)
        return _merge([_walk(k, srcs, acc, weight) for k in n.kids])
    body = n.kids[0]
    if n.hi is None and n.lo >= 2:
        # X{m,} is X{m} then X*: the counted part can be re-entered like any other
        # (.[b]*[\x01-"]{59,}: > 3 s at 32k)
        srcs = _walk(Node(REP, kids=[body], lo=n.lo, hi=n.lo), srcs, acc, weight)
        n = Node(REP, kids=[body], lo=0, hi=None)
    if n.hi is None:  # a loop: a new lingering source
        new = _Src(id(n), body.chars, frozenset(), body.last, True)
        out = _walk(body, _cap((*srcs, new)), acc, weight)
        passed = out if n.lo > 0 else _merge([srcs, out])
        return _cap((*(s for s in passed if s.key != id(n)), new))
    if n.hi <= 1:
        out = _walk(body, srcs, acc, weight)
        return out if n.lo > 0 else _merge([srcs, out])
    x = body
    single = x.kind == LIT
    ambiguous = False
    entry = 0
    interval = False
    for s in srcs:
        if any(not meets(m, x.chars) for m in s.must):
            continue  # the entry path needs a character X cannot hold: one entry per run
        if not meets(x.chars, s.cls):
            continue  # the loop dies while a thread is inside X
        if s.direct:
            if not single and meets(x.first, s.cls) and not _one_class(x, s.cls):
                ambiguous, entry = True, entry | s.cls
            else:
                interval = True
        elif meets(s.last, x.chars):
            if single and covers(s.last, x.chars):
                interval = True
            else:
                ambiguous, entry = True, entry | s.last
    # A wide loop still alive lets new threads start while one counts through X: blocked
    # from entering X or not, they can also sit anywhere before it that X's characters allow
    # (.*[a%+-]root ::= +B@[a-zA-Z8-9.-]+\.[a-zA-Z]{32,}: 1.19 s at 32k; a 70-character
    # literal after .* before [a-zA-Z]{5,}: 1.1 s). Each such position multiplies the
    # anchored states.
    sitting = 0
    for s in srcs:
        if s.key != 0 and meets(s.cls, x.chars) and _wide_class(s.cls):
            sitting = max(sitting, sum(1 for m in s.must if meets(m, x.chars)))
    if sitting:
        acc.concurrent += math.log2(1 + sitting)
    if interval and s_key_nonstart(srcs):
        # [a-z-]+-{649}: every run length of X is a state, walked by X's long tokens
        # (1.08 s at 32k); priced as the count's positions once more
        acc.interval += n.hi * weight
    if not ambiguous and x.minlen != x.maxlen and meets(x.last, x.first) and not _deterministic(x):
        ambiguous, entry = True, x.first
    if ambiguous:
        b = 1 + max(1, _nlast_overlap(x, entry))
        contrib = n.hi * math.log2(b) * weight
        acc.log2 += contrib
        acc.multibyte = acc.multibyte or multibyte(x.chars)
        if not acc.why:
            acc.why = f"a counted repetition {{{n.lo},{n.hi}}} re-entered while inside it"
    inner = _merge([srcs, _consume(srcs, x.last)])
    out = _walk(x, inner, acc, min(_WEIGHT_CAP, weight * n.hi))
    return out if n.lo > 0 else _merge([srcs, out])


_BROAD_MIN = 48  # printable ASCII characters for a class to let most tokens through
_LETTERS = (((1 << 26) - 1) << 65) | (((1 << 26) - 1) << 97)


def _positions(n: Node) -> tuple[float, float]:
    """(narrow, broad) NFA positions, counts multiplied out, multi-byte classes weighted by
    the UTF-8 automaton states they need."""
    if n.kind == LIT:
        extra = 0.0
        if multibyte(n.cs):
            # UTF-8 automaton states of the class: \w ~100 (measured: \w+ 0.13 s at 32k),
            # other categories (\d: 203 states for \d{4}-\d{2}-\d{2}, but few digit tokens walk
            # them: priced as 13 positions), a range ~7
            extra = 99.0 if n.cs >> 131 & 1 else 12.0 if n.cs >> 130 & 1 else 6.0
        # a class of letters is where a BPE vocabulary's long tokens are: each of its states is
        # walked deeper ([a-zA-Z]{235,}: 0.38 s at 32k)
        weight = 1.5 if (n.cs & _LETTERS).bit_count() >= 26 else 1.0
        if ascii_printable(n.cs) >= _BROAD_MIN:
            return extra, weight
        return weight + extra, 0.0
    if n.kind == REP:
        a, b = _positions(n.kids[0])
        m = max(1, n.lo) if n.hi is None else max(1, n.hi)
        return min(a * m, 1e15), min(b * m, 1e15)
    a = b = 0.0
    for k in n.kids:
        x, y = _positions(k)
        a, b = a + x, b + y
    return a, b


class _Shape(NamedTuple):
    exp_a: float  # log2 multiplier of anchored states
    exp_u: float  # ... of unanchored states
    narrow: float
    broad: float
    why: str
    loops: int = 0  # extra unbounded loops over wide classes (each doubles anchored states)


def _regex_shape(root: Node) -> _Shape:
    acc_a, acc_u = _Acc(), _Acc()
    _walk(root, (), acc_a, 1.0)
    _walk(root, (_Src(0, -1, frozenset(), 0, True),), acc_u, 1.0)
    mb = math.log2(4.5)
    exp_a = acc_a.log2 + (mb if acc_a.multibyte and acc_a.log2 > 0 else 0.0)
    exp_u = acc_u.log2 + (mb if acc_u.multibyte and acc_u.log2 > 0 else 0.0)
    narrow, broad = _positions(root)
    narrow += min(acc_a.interval, 1e15)
    # Unbounded loops over wide classes stay alive together: the anchored DFA tracks which of
    # them a thread may still be in (measured: a fuzzed regex with four such loops and three
    # \w cost 1.1 s at 32k). One doubling of the anchored states per extra loop.
    loops = min(40, max(0, _broad_loops(root) - 1) + round(acc_a.concurrent + 0.5))
    return _Shape(exp_a, exp_u, narrow, broad, acc_a.why or acc_u.why, loops)


def _broad_loops(root: Node) -> int:
    count = 0
    stack = [root]
    while stack:
        x = stack.pop()
        if x.kind == REP and x.hi is None:
            cs = x.kids[0].chars
            if ascii_printable(cs) >= _BROAD_MIN or multibyte(cs):
                count += 1
        stack.extend(x.kids)
    return count


# Measured upper fits (seconds or bytes per unit, one core).
_O_FIXED_S = 0.005
_O_C_REGEX = 4e-8  # per anchored state x vocabulary token, request regexes
_O_C_SCHEMA = 1.6e-7  # the same for schema-derived regexes (quote/space-led tokens live longer)
_O_C_DFA = 7e-7  # per DFA state x NFA position (determinisation)
_O_M_NARROW = 1.0  # bytes per anchored state x token, narrow classes
_O_M_BROAD = 12.0  # ... per share of broad classes
_O_M_DFA = 40.0
# The campaigns keep finding regexes near the budget (0.85 s measured, 0.86 estimated; 1.06 s,
# 0.89 s with a 1.25 margin): a
# margin over the fitted constants for shapes the model approximates.
_O_MARGIN = 1.6


def _outlines_price(shape: _Shape, vocab: int, *, schema: bool) -> tuple[float, float]:
    ea = min(shape.exp_a, _LOG2_CAP)
    eu = min(shape.exp_u, _LOG2_CAP)
    pos = max(1.0, shape.narrow + shape.broad)
    sa = (4.0 * 2.0**ea + pos if ea > 0 else pos) * 2.0**shape.loops
    dfa = (2.0**eu + 2.0**ea) * pos
    c = _O_C_SCHEMA if schema else _O_C_REGEX
    t = (_O_FIXED_S + vocab * sa * c + _O_C_DFA * dfa) * (1.0 if schema else _O_MARGIN)
    share = shape.broad / pos
    m = _O_M_BROAD if schema else _O_M_NARROW + _O_M_BROAD * min(1.0, 8 * share)
    mem = vocab * sa * m + _O_M_DFA * dfa
    return t, mem / (1 << 20)


@functools.lru_cache(maxsize=512)
def _shape_of(pattern: str) -> _Shape | str:
    """The outlines shape of a regex, or why it cannot be priced. Cached by pattern: the value
    is a few numbers (the tree is not kept)."""
    try:
        return _regex_shape(parse_regex(pattern))
    except Unpriceable as exc:
        return str(exc)


def _outlines_regex(pattern: str, vocab: int) -> Estimate:
    shape = _shape_of(pattern)
    if isinstance(shape, str):
        return Estimate(_INF, _INF, 0.0, [f"a regex the estimate cannot price ({shape})"])
    t, mem = _outlines_price(shape, vocab, schema=False)
    why = [shape.why] if shape.why else [f"{shape.narrow + shape.broad:.0f} automaton positions"]
    return Estimate(t, mem, 0.0, why)


# ---- outlines: schemas (the regex outlines-core derives, sized without building it) ---------

_ANY_JSON_POS = 900.0  # positions of outlines' generic JSON value regex (two levels deep)
_STRING_POS = 5.0
# Fixed regexes, so priced from their measurement at 32k (0.0445 s for a bare date, 0.0175
# date-time, 0.025 uuid, 0.0715 email), three times over.
_FORMAT_POS = {"date-time": 15.0, "date": 25.0, "time": 15.0, "uuid": 15.0, "email": 40.0}
_FORMAT_POS_DEFAULT = 15.0
_SCALAR_POS = {"integer": 8.0, "number": 16.0, "boolean": 10.0, "null": 4.0}
_PER_STRING_COUNT = 1.5  # positions per unit of a string's length bound (24 in a property: 0.13 s)
_MAX_REF_DEPTH = 3  # outlines-core refuses deeper $ref chains ("Ref recursion limit")


class _OutlinesRejects(Exception):
    pass


class _SchemaSizer:
    """Positions and exponential terms of the regex outlines-core would build for a schema."""

    def __init__(self, root: Any) -> None:
        self.root = root
        self.exp_u = 0.0
        self.exp_a = 0.0
        self.multibyte = False
        self.why = ""
        self.memo: dict[tuple[int, bool, int], float] = {}

    def size(self, node: Any, top: bool, refs: int) -> float:
        if not isinstance(node, Mapping) or not node:
            return _ANY_JSON_POS
        key = (id(node), top, refs)
        got = self.memo.get(key)
        if got is not None:
            return got
        out = min(1e15, self._size(node, top, refs))
        self.memo[key] = out
        return out

    def _size(self, s: Mapping[str, Any], top: bool, refs: int) -> float:
        ref = s.get("$ref")
        if isinstance(ref, str):
            if refs >= _MAX_REF_DEPTH:
                raise _OutlinesRejects
            return self.size(resolve_ref(self.root, ref), top, refs + 1)
        enum = s.get("enum")
        if isinstance(enum, list):
            return float(trie_size(_json_text(v) for v in enum)) + 2
        if "const" in s:
            return float(len(_json_text(s["const"]))) + 2
        for key in ("anyOf", "oneOf", "allOf"):
            alts = s.get(key)
            if isinstance(alts, list):
                return sum(self.size(a, top, refs) for a in alts) + 2
        t = s.get("type")
        if isinstance(t, list):
            return sum(self.size({**s, "type": x}, top, refs) for x in t) + 2
        if t == "string":
            return self._string(s, top)
        if t in _SCALAR_POS:
            return _SCALAR_POS[t]
        if t == "array" or "items" in s or "prefixItems" in s:
            items = s.get("items")
            item = self.size(items, False, refs) if isinstance(items, Mapping) else _ANY_JSON_POS
            lo, hi = _count(s.get("minItems")), _count(s.get("maxItems"))
            reps = max(2, hi) if hi is not None else max(2, lo or 0)
            return item * reps + 8
        if t == "object" or "properties" in s:
            props = s.get("properties")
            if not isinstance(props, Mapping) or not props:
                return _ANY_JSON_POS
            # a key's literal characters end most tokens' walks at once: a quarter each
            return sum(self.size(v, False, refs) + len(k) / 4 + 6 for k, v in props.items()) + 4
        return _ANY_JSON_POS

    def _string(self, s: Mapping[str, Any], top: bool) -> float:
        hi, lo = _count(s.get("maxLength")), _count(s.get("minLength"))
        if hi is not None or lo is not None:
            bound = max(hi or 0, lo or 0)
            if bound >= 2 and top:
                # A bare string's opening quote can recur inside it as \": re-entry (a lower
                # bound too: X{m,} is X{m} then X*).
                self.exp_u += 1.2 * bound  # x2.1-2.3 per count measured (14: 1.02 s at 32k)
                self.why = self.why or f"a top-level string with a length bound of {bound}"
            return _PER_STRING_COUNT * max(hi or 0, lo or 0) + _STRING_POS
        pattern = s.get("pattern")
        if isinstance(pattern, str):
            shape = _shape_of(pattern)
            if isinstance(shape, str):
                raise _OutlinesRejects
            self.exp_u += shape.exp_u
            self.exp_a += shape.exp_a
            if shape.exp_u > 0 and not self.why:
                self.why = shape.why
            return shape.narrow + shape.broad + 2
        fmt = s.get("format")
        if isinstance(fmt, str):
            return _FORMAT_POS.get(fmt, _FORMAT_POS_DEFAULT)
        return _STRING_POS


def _json_text(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def trie_size(words: Iterable[str]) -> int:
    """Nodes of the trie of ``words``: the states an automaton for their alternation needs
    (a prefix shared by many values costs once). Linear in their total length."""
    root: dict[str, Any] = {}
    nodes = 0
    for word in words:
        node = root
        for ch in word:
            nxt = node.get(ch)
            if nxt is None:
                nxt = node[ch] = {}
                nodes += 1
            node = nxt
    return nodes


_count = count_of


def _outlines_schema(schema: Any, vocab: int, facts: Memo | None) -> Estimate:
    if schema is True or schema == {}:
        schema = {}
    if not isinstance(schema, Mapping):
        return Estimate(accepted=False)
    if facts_of(schema, facts).not_if:
        return Estimate(accepted=False)  # outlines-core refuses "not" and "if" (vLLM: 400)
    sizer = _SchemaSizer(schema)
    try:
        pos = sizer.size(schema, True, 0)
    except (_OutlinesRejects, RecursionError):
        return Estimate(accepted=False)
    shape = _Shape(sizer.exp_a, sizer.exp_u, pos, 0.0, sizer.why)
    t, mem = _outlines_price(shape, vocab, schema=True)
    why = [sizer.why] if sizer.why else [f"~{pos:.0f} automaton positions"]
    return Estimate(t, mem, 0.0, why)


def outlines_cost(kind: str, spec: Any, vocab: int, facts: Memo | None = None) -> Estimate:
    """outlines-core's index build for ``kind`` in ``regex``, ``json``, ``choice`` (it refuses
    grammars, ``json_object`` and structural tags)."""
    if kind == "regex" and isinstance(spec, str):
        return _outlines_regex(spec, vocab)
    if kind == "json":
        return _outlines_schema(spec, vocab, facts)
    if kind == "choice" and isinstance(spec, list):
        chars = trie_size(c for c in spec if isinstance(c, str)) + 2
        t = _O_FIXED_S + vocab * chars * _O_C_REGEX
        return Estimate(t, vocab * chars * _O_M_NARROW / (1 << 20), 0.0, [f"{len(spec)} choices"])
    return Estimate(accepted=False)


# ---- xgrammar ---------------------------------------------------------------------------------

_X_FIXED_S = 0.002
_X_WIDE_100 = 2.55e-7  # per copy (the first 100) x token: bounded repetition of a wide class
_X_WIDE_OVER = 8e-8  # per copy (101st to 400th) x token ([r"-zA-Z*]{170,}: 0.93 s at 32k)
# Copies past this cost nothing more: measured with xgrammar 0.2.8 at cl100k_base (issue 23),
# one string of maxLength 1000 5.7 s, 2000 4.6 s, 4000 4.7 s, `.{0,3000}` 4.7 s (the tweet's 280:
# 5.4 s); at 32k, maxLength 1000 ~1.5 s. What grows is the number of distinct bounded rules.
_X_WIDE_SATURATED = 400
_X_ENUM = 4.4e-9  # per enum value squared, at 32k tokens
_X_CHOICE = 8.5e-9  # per choice squared
_X_PROPS = 2.9e-5  # per optional property squared
_X_RULES = 1.8e-8  # per grammar rule squared
_X_AMB_WIDE = 1e-4  # per decode token per A**3, A = ambiguity of nested repetition
_X_AMB_NARROW = 1e-8
_WIDE_MIN = 16  # printable ASCII characters ([0-9]: narrow; [A-Za-z ]{1,50}: 0.32 s at 32k)
_REF_VOCAB = 32768


def _wide(cs: int) -> bool:
    # xgrammar reads \d \w \s as ASCII classes: a category's non-ASCII part does not count
    return ascii_printable(cs) >= _WIDE_MIN or (multibyte(cs) and not cs >> 130 & 1)


def _inner_var(n: Node) -> float:
    best = 1.0
    stack = [n]
    while stack:
        x = stack.pop()
        if x.kind == REP:
            best = max(best, 2.0 if x.hi is None else float(x.hi - x.lo + 1))
        stack.extend(x.kids)
    return best


def _has_rep(n: Node) -> bool:
    stack = [n]
    while stack:
        x = stack.pop()
        if x.kind == REP:
            return True
        stack.extend(x.kids)
    return False


class _XTerms:
    __slots__ = ("amb_narrow", "amb_wide", "wide")

    def __init__(self) -> None:
        self.wide: list[int] = []
        self.amb_wide = 1.0
        self.amb_narrow = 1.0


def _xgr_terms(n: Node, acc: _XTerms, outer: float) -> None:
    if n.kind == REP:
        body = n.kids[0]
        # an unbounded repetition unrolls its lower bound ([a-zA-Z]{170,}: 0.23 s at 32k)
        count = n.hi if n.hi is not None else n.lo
        if count >= 2 and _wide(body.chars):
            acc.wide.append(count)
        amb = outer
        if (
            n.hi is not None
            and n.hi >= 2
            and body.minlen != body.maxlen
            and meets(body.last, body.first)
        ):
            amb = min(1e9, outer * n.hi)
        for k in n.kids:
            if _has_rep(k):
                inner = _inner_var(k)
                if amb > 1 and inner > 1:
                    a = min(1e9, amb * inner)
                    if _wide(k.chars):
                        acc.amb_wide = max(acc.amb_wide, a)
                    else:
                        acc.amb_narrow = max(acc.amb_narrow, a)
            _xgr_terms(k, acc, amb)
        return
    for k in n.kids:
        _xgr_terms(k, acc, outer)


def _wide_cost(count: int, vocab: int) -> float:
    over = max(0, min(count, _X_WIDE_SATURATED) - 100)
    return vocab * (_X_WIDE_100 * min(count, 100) + _X_WIDE_OVER * over)


_COUNTS = re.compile(r"\{(\d{1,12})(?:,(\d{0,12}))?\}")


@functools.lru_cache(maxsize=512)
def _xgr_terms_of(pattern: str) -> tuple[tuple[int, ...], float, float, bool]:
    """xgrammar's terms of a regex: the counts of bounded repetitions of wide classes, the
    ambiguity degrees (wide, narrow), and whether it was priced from its tree (else every
    ``{m,n}`` is counted as wide). Cached by pattern."""
    try:
        root = parse_regex(pattern)
    except Unpriceable:
        # Priced as if every {m,n} were over a wide class (xgrammar has no look-around: such
        # a regex goes elsewhere or is refused).
        counts = tuple(int(m.group(2) or m.group(1)) for m in _COUNTS.finditer(pattern))
        return counts, 1.0, 1.0, False
    acc = _XTerms()
    _xgr_terms(root, acc, 1.0)
    return tuple(acc.wide), acc.amb_wide, acc.amb_narrow, True


def _xgr_regex(pattern: str, vocab: int, est: Estimate) -> None:
    wide, amb_wide, amb_narrow, priced = _xgr_terms_of(pattern)
    if not priced:
        for count in wide:
            est.compile_s += _wide_cost(count, vocab)
        return
    for count in wide:
        est.compile_s += _wide_cost(count, vocab)
        if count >= 100:
            est.why.append(f"a bounded repetition of a wide class ({count})")
    scale = vocab / _REF_VOCAB
    if amb_wide > 1:
        est.mask_s = max(est.mask_s, _X_AMB_WIDE * amb_wide**3 * scale)
        est.why.append(f"nested ambiguous repetition (degree {amb_wide:.0f}), paid per token")
    if amb_narrow > 1:
        est.mask_s = max(est.mask_s, _X_AMB_NARROW * amb_narrow**3 * scale)


def xgrammar_cost(kind: str, spec: Any, vocab: int, facts: Memo | None = None) -> Estimate:
    est = Estimate(_X_FIXED_S)
    scale = vocab / _REF_VOCAB
    if kind == "regex" and isinstance(spec, str):
        _xgr_regex(spec, vocab, est)
    elif kind == "json":
        # each object's terms, objects in pre-order, children right to left; a string rule
        # (its bounds) is compiled once per schema, however many properties share it
        rules: set[tuple[str, str]] = set()
        for term in facts_of(spec, facts).xgr:
            tag = term[0]
            if tag == "L":
                _, count, weight, key, bounds = term
                if (key, bounds) in rules:
                    continue
                rules.add((key, bounds))
                est.compile_s += _wide_cost(count, vocab) * weight
                if count >= 100:
                    est.why.append(f"a string {key} of {count}")
            elif tag == "P":
                _xgr_regex(term[1], vocab, est)
            elif tag == "E":
                est.compile_s += _X_ENUM * term[1] ** 2 * scale
            else:  # "O": optional properties
                est.compile_s += _X_PROPS * term[1] ** 2
    elif kind == "choice" and isinstance(spec, list):
        est.compile_s += _X_CHOICE * len(spec) ** 2 * scale
    elif kind == "grammar" and isinstance(spec, str):
        est.compile_s += _X_RULES * count_rules(spec) ** 2
    return est


# ---- llguidance -------------------------------------------------------------------------------

_G_FIXED_S = 0.002
_G_GBNF = 6.5e-7  # per GBNF rule squared (the Python GBNF -> Lark conversion)
_G_LARK = 2.5e-8
_G_ITEMS = 1e-5  # per unit of minItems / maxItems
_G_ITEMS_MB = 2e-3
_G_COUNT = 4e-7  # per unit of a counted repetition over 10,000
_G_CHOICE = 3.6e-5
_RULE = re.compile(r"(?m)^[ \t]*[A-Za-z_][\w.-]*(?:\[[^\]\n]*\])?[ \t]*(?:::=|:)")


def count_rules(grammar: str) -> int:
    return len(_RULE.findall(grammar))


def guidance_cost(kind: str, spec: Any, vocab: int, facts: Memo | None = None) -> Estimate:
    est = Estimate(_G_FIXED_S)
    if kind == "grammar" and isinstance(spec, str):
        rules = count_rules(spec)
        est.compile_s += (_G_GBNF if "::=" in spec else _G_LARK) * rules**2
    elif kind == "json":
        for count in facts_of(spec, facts).g_items:
            est.compile_s += _G_ITEMS * count
            est.mem_mb += _G_ITEMS_MB * count
    elif kind == "choice" and isinstance(spec, list):
        est.compile_s += _G_CHOICE * len(spec)
    if kind in ("regex", "grammar") and isinstance(spec, str):
        for m in re.finditer(r"\{(\d{1,12})(?:,(\d{0,12}))?\}", spec):
            count = int(m.group(2) or m.group(1))
            if count > 10_000:
                est.compile_s += _G_COUNT * count
                est.mask_s = max(est.mask_s, min(0.2, 1.2e-6 * count))
    return est

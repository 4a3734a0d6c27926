"""How many parse stacks llama.cpp may keep alive at once for a GBNF grammar: an estimate.

llama.cpp's grammar engine (``llama_grammar_advance_stack`` / ``llama_grammar_accept`` /
``llama_grammar_reject_candidates`` in src/llama-grammar.cpp) keeps one stack of positions per
way of reading the text generated so far; identical stacks are merged, different ones are not,
and every token mask walks every stack over the whole vocabulary. A stack differs from another
by its position, so a piece of text that can be read as "this element goes on" or as "this
element ended and the next began" keeps one stack per position the element could be in: with
``[a-z]{1,999}`` (unrolled into 999 nested optional rules, one position each) before something
that may start with a letter, up to 999 stacks, each costing a full mask.

The estimate, per rule, on llama.cpp's rules after ``{m,n}`` unrolling (linear in their size;
character sets are bit sets of ASCII, one bit for all non-ASCII and one for tokens):

- ``first``: the characters a rule can start with; ``ext``: the characters that can continue a
  match of it that could also end here (its variable tail: ``[a-z]{0,9}`` ends or goes on);
- ``tails``: how many distinct positions such an extensible end can be in (one per optional
  rule an ending may stop at: 999 for ``[a-z]{1,999}``, 1 for ``[a-z]*`` whose rule loops onto
  itself), counted along the references at the ends of rules;
- ``live``: in a sequence, an item whose ``ext`` meets what the rest of the sequence can start
  with adds stacks alive at once: a loop or a recursion back into the rule starts the ended
  element again (``item+``, right recursion), so all its ``tails``; a next item met once
  (llama.cpp's unrolled ``{m,n}`` chain is such a next item each time, ``[a-z]{0,9} "a"``) no
  more than the positions it can be in. Chains of such overlaps add up. Alternatives that can
  start with the same character and hold several stacks each add up (``item+ | item+``
  doubles). Items of a recursion count 1 inside it (its doubling per nesting level is the other
  check, in ._gbnf).

The estimate is an over-approximation of the peak (each conflict counted as if all its
readings lived at once), within a small factor of what was measured in llama.cpp
(tests/guard/guided/test_gbnf.py has the table).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ANY_CHAR",
    "TOKEN_BIT",
    "char_bits",
    "live_stacks",
    "negate_bits",
    "sccs",
]

_NON_ASCII = 1 << 128
ANY_CHAR = (1 << 129) - 1  # every character: ASCII bits and the non-ASCII bit
TOKEN_BIT = 1 << 129  # a token element (<[id]>, !<[id]>)
# Counts stop growing here: far above any budget, small enough for cheap integers.
_CAP = 1 << 40

Item = tuple[int, int, int]  # (ref: a rule >= 0, a terminal -1 - i; elements; copies)


def char_bits(lo: int, hi: int) -> int:
    """The bit set of code points ``lo..hi``."""
    bits = 0
    if lo < 128:
        top = min(hi, 127)
        if top >= lo:
            bits = ((1 << (top + 1)) - 1) ^ ((1 << lo) - 1)
    if hi >= 128:
        bits |= _NON_ASCII
    return bits


def negate_bits(bits: int) -> int:
    """A negated class: the ASCII characters it leaves, and non-ASCII ones (kept: coarse)."""
    return (ANY_CHAR & ~bits) | _NON_ASCII


def sccs(edges: Sequence[Sequence[int]]) -> list[int]:
    """Tarjan's strongly connected components, iteratively: the component of each node,
    numbered so that a component's successors come before it."""
    size = len(edges)
    index = [-1] * size
    low = [0] * size
    comp = [-1] * size
    on_stack = [False] * size
    stack: list[int] = []
    counter = 0
    ncomp = 0
    for root in range(size):
        if index[root] >= 0:
            continue
        work: list[tuple[int, int]] = [(root, 0)]
        while work:
            node, i = work[-1]
            if i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack[node] = True
            if i < len(edges[node]):
                work[-1] = (node, i + 1)
                nxt = edges[node][i]
                if index[nxt] < 0:
                    work.append((nxt, 0))
                elif on_stack[nxt]:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack[member] = False
                    comp[member] = ncomp
                    if member == node:
                        break
                ncomp += 1
    return comp


def _by_component(edges: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    comp = sccs(edges)
    members: list[list[int]] = [[] for _ in range(max(comp, default=-1) + 1)]
    for node, c in enumerate(comp):
        members[c].append(node)
    return comp, members


def _union_closure(edges: Sequence[Sequence[int]], local: Sequence[int]) -> list[int]:
    """Each node's ``local`` bits or-ed with those of every node it reaches."""
    comp, members = _by_component(edges)
    value = [0] * len(members)
    for c, nodes in enumerate(members):  # successors first
        bits = 0
        for node in nodes:
            bits |= local[node]
            for nxt in edges[node]:
                bits |= local[nxt] if comp[nxt] == c else value[comp[nxt]]
        value[c] = bits
    return [value[comp[node]] for node in range(len(comp))]


def _path_sum(edges: Sequence[Sequence[int]], own: Sequence[int]) -> list[int]:
    """Each node's ``own`` plus that of every path out of it, a cycle's members counted once
    (a rule looping onto itself at its end is one position, however often it turns)."""
    comp, members = _by_component(edges)
    value = [0] * len(members)
    for c, nodes in enumerate(members):
        total = 0
        for node in nodes:
            total += own[node]
            for nxt in edges[node]:
                if comp[nxt] != c:
                    total += value[comp[nxt]]
        value[c] = min(total, _CAP)
    return [value[comp[node]] for node in range(len(comp))]


def _bits(mask: int) -> list[int]:
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def live_stacks(
    rules: Sequence[Sequence[Sequence[Item]]],
    terms: Sequence[int],
    nullable: Sequence[bool],
    root: int,
) -> int:
    """The estimated peak number of parse stacks llama.cpp keeps for the grammar ``rules``
    (rule id -> alternatives -> items), whose start is ``root``."""
    size = len(rules)
    # first: the characters at the left of each rule, past references that can match empty.
    left: list[list[int]] = [[] for _ in range(size)]
    direct = [0] * size
    for rid, alts in enumerate(rules):
        for alt in alts:
            for ref, _, _ in alt:
                if ref < 0:
                    direct[rid] |= terms[-1 - ref]
                    break
                left[rid].append(ref)
                if not nullable[ref]:
                    break
    first = _union_closure(left, direct)
    # ext and tails, along the references at the ends of rules (past nullable ones).
    tail: list[list[int]] = [[] for _ in range(size)]
    for rid, alts in enumerate(rules):
        for alt in alts:
            for ref, _, _ in reversed(alt):
                if ref < 0:
                    break
                tail[rid].append(ref)
                if not nullable[ref]:
                    break
    ends = [first[rid] if nullable[rid] else 0 for rid in range(size)]
    ext = _union_closure(tail, ends)
    tails = _path_sum(tail, [1 if e else 0 for e in ends])
    # live, over the whole reference graph, a rule after those it references.
    refs: list[list[int]] = [
        sorted({ref for alt in alts for ref, _, _ in alt if ref >= 0}) for alts in rules
    ]
    comp, members = _by_component(refs)
    live = [1] * size
    for c, nodes in enumerate(members):
        for rid in nodes:
            live[rid] = _rule_live(rules[rid], c, comp, terms, nullable, first, ext, tails, live)
    # The rules llama.cpp can reach from the start.
    seen = [False] * size
    todo = [root]
    seen[root] = True
    peak = 1
    while todo:
        rid = todo.pop()
        peak = max(peak, live[rid])
        for ref in refs[rid]:
            if not seen[ref]:
                seen[ref] = True
                todo.append(ref)
    return peak


def _rule_live(
    alts: Sequence[Sequence[Item]],
    c: int,
    comp: Sequence[int],
    terms: Sequence[int],
    nullable: Sequence[bool],
    first: Sequence[int],
    ext: Sequence[int],
    tails: Sequence[int],
    live: Sequence[int],
) -> int:
    firsts: dict[int, tuple[int, int]] = {}  # an alternative -> (its first characters, live)
    best = 1
    for alt in alts:
        # What the rest of the sequence can start with, from each item on.
        n = len(alt)
        suffix = [0] * (n + 1)
        for i in range(n - 1, -1, -1):
            ref = alt[i][0]
            if ref < 0:
                suffix[i] = terms[-1 - ref]
            else:
                suffix[i] = first[ref] | (suffix[i + 1] if nullable[ref] else 0)
        run = 0
        alt_live = 1
        open_ext = 0  # what the extensible ends before this item can go on with
        open_tails = 0  # and in how many positions they can be
        for i, (ref, _, copies) in enumerate(alt):
            if ref < 0:
                cur, its_ext, its_tails, empty = 1, 0, 0, False
            else:
                cur = live[ref] if comp[ref] != c else 1
                its_ext, its_tails, empty = ext[ref], tails[ref], nullable[ref]
            # Text here may still belong to an earlier item's end: each reading keeps its own
            # stacks, one per position that item could have ended in.
            # Once (``.{0,200} "\n"``): no more of them than the positions this item can be in
            # (a terminal: one, so two stacks there, not 200); a loop or recursion back into
            # this rule starts the ended element again: all of them.
            again = ref >= 0 and comp[ref] == c
            extra = open_tails if again else min(open_tails, 1 + its_tails)
            run = min(run + extra + cur, _CAP) if open_ext & suffix[i] else cur
            if copies > 1 and its_ext & first[ref]:  # X X ...: the same, copies times
                if empty:
                    # Copies that may each be skipped (``[a-z]?{30}``): k letters sit in any k of
                    # the copies, and llama.cpp's mask follows every way (its candidate walk
                    # keeps no memo), so the ways multiply with the copies.
                    run = min(run * (its_tails + 1) ** min(copies - 1, 64), _CAP)
                else:
                    run = min(run + (copies - 1) * (its_tails + cur), _CAP)
            alt_live = max(alt_live, run)
            if empty:
                open_ext |= its_ext
                open_tails += its_tails
            else:
                open_ext, open_tails = its_ext, its_tails
        best = max(best, alt_live)
        # Alternatives starting alike each keep their stacks: those with several of their own
        # add up (``item+ | item+``); one stack each dies where the texts part (an enum of
        # strings), and alternatives that are one same reference end in the same stacks.
        if alt_live > 1:
            key = alt[0][0] if len(alt) == 1 and alt[0][0] >= 0 else -1 - len(firsts)
            firsts[key] = (suffix[0], alt_live)
    per_char: dict[int, int] = {}
    for bits, alt_live in firsts.values():
        for bit in _bits(bits):
            per_char[bit] = min(per_char.get(bit, 0) + alt_live, _CAP)
    return max(best, max(per_char.values(), default=1))

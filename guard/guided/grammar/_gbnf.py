"""llama.cpp's GBNF parser, mirrored: what ``llama_grammar_init_impl`` accepts.

llama-cpp-python 0.3.36 hands a request's ``grammar`` (and the grammar it makes of a JSON
schema) to ``llama_sampler_init_grammar``; when llama.cpp's parser refuses the grammar that
returns NULL, the NULL is added to the sampler chain unchecked and the server dies (SIGSEGV).
So every grammar llama.cpp would refuse must be refused here, and nothing llama.cpp accepts
may be refused. This is a port of ``llama_grammar_parser::parse`` (vendor/llama.cpp
src/llama-grammar.cpp, as vendored by llama-cpp-python 0.3.36) and of the checks
``llama_grammar_init_impl`` makes after it:

- the syntax: rule names are ``[A-Za-z0-9-]+`` (no ``_``), ``::=``, a rule ends at a newline
  or the end (``#`` comments, newlines only inside groups), ``"..."`` literals and ``[...]``
  classes with only the escapes ``\\x.. \\u.... \\U........ \\t \\r \\n \\\\ \\" \\[ \\] \\-``,
  ``.``, groups, ``* + ? {m} {m,} {m,n}`` after an item, tokens ``<[id]>`` (``<text>``
  tokens need the model's vocabulary, which the guard does not have: refused);
- ``{m,n}``: m over 2,000 is refused, n over 2,000 means no maximum, the product of nested
  repetition counts over 2,000 is refused (``MAX_REPETITION_THRESHOLD``); ``n < m`` is
  accepted by llama.cpp and then unrolled 2**64 times (it never returns): refused;
- every rule referenced is defined, the grammar is not empty, it defines ``root``;
- no left recursion (``llama_grammar_detect_left_recursion``: a rule reached again at the
  left of its own expansion, past rules that have an empty alternative).

The C text ends at the first NUL (ctypes passes a C string), so does this reading.

It also measures what llama.cpp would spend: group nesting (its parser recurses once per
group, ~430 bytes of an 8 MB thread stack each: ~19,250 groups crash it), grammar elements
(``"long literal"{2000}`` is copied 2,000 times) and the calls of its left-recursion check,
which has no memo: ``a0 ::= a1 | a1``, ``a1 ::= a2 | a2``, ... costs 2**n calls.

No recursion: groups and the rule graph are walked with explicit stacks.
"""

from __future__ import annotations

from dataclasses import dataclass

from guard.errors import RegexRejected
from guard.guided._limits import GuidedLimits
from guard.guided.grammar._stacks import (
    ANY_CHAR,
    TOKEN_BIT,
    char_bits,
    live_stacks,
    negate_bits,
    sccs,
)

__all__ = ["GbnfLimits", "parse_gbnf"]

MAX_REPETITION_THRESHOLD = 2000
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1
_HEX = frozenset("0123456789abcdefABCDEF")
_SIMPLE_ESCAPES = frozenset('trn\\"[]-')
_ESCAPED = {"t": "\t", "r": "\r", "n": "\n"}


@dataclass(frozen=True, slots=True)
class GbnfLimits:
    max_depth: int  # group nesting
    max_elements: int  # grammar elements (plus 4 a rule) llama.cpp allocates
    max_steps: int  # calls of llama.cpp's left-recursion check
    max_left_depth: int  # its recursion depth along leftmost rule references
    max_stacks: int  # parse stacks it may keep alive at once (._stacks' estimate)

    @classmethod
    def of(cls, limits: GuidedLimits, max_depth: int) -> GbnfLimits:
        """The policy's grammar limits, with the nesting cap of the grammar's source."""
        return cls(
            max_depth=max_depth,
            max_elements=limits.max_grammar_elements,
            max_steps=limits.max_grammar_steps,
            max_left_depth=limits.max_grammar_left_depth,
            max_stacks=limits.max_grammar_stacks,
        )


class _Invalid(Exception):
    pass


# An item of a rule: a rule reference (``ref`` >= 0) or a literal, class, token or ``.`` (``ref``
# -1 - i, its first characters ``terms[i]``), with the number of llama.cpp elements it holds and
# how many copies of it stand in a row.
_Item = tuple[int, int, int]  # (ref, elements, copies)


class _Frame:
    """A rule or group being parsed: its alternatives and the current one's state."""

    __slots__ = ("alternates", "last", "n_prev", "nested", "rule_id", "seq", "symbols_before")

    def __init__(self, rule_id: int, nested: bool, symbols_before: int) -> None:
        self.rule_id = rule_id
        self.nested = nested
        self.symbols_before = symbols_before
        self.seq: list[_Item] = []
        self.alternates = [self.seq]
        self.last = 0  # last_sym_start, as an index into seq
        self.n_prev = 1  # n_prev_rules


class _Parser:
    def __init__(self, text: str, limits: GbnfLimits) -> None:
        nul = text.find("\0")
        self.src = text if nul < 0 else text[:nul]
        self.n = len(self.src)
        self.limits = limits
        self.symbol_ids: dict[str, int] = {}
        self.rules: dict[int, list[list[_Item]]] = {}  # rule id -> alternates
        self.elements = 0
        self.depth = 0
        self.nullable: list[bool] = []
        self.left_edges: list[list[int]] = []  # references at a rule's left, past nullable ones
        self.terms: list[int] = []  # first characters of each terminal item (._stacks' bits)

    # -- lexical helpers (C's *pos is NUL past the end) --
    def ch(self, pos: int) -> str:
        return self.src[pos] if pos < self.n else "\0"

    def parse_space(self, pos: int, newline_ok: bool) -> int:
        src, n = self.src, self.n
        while pos < n:
            c = src[pos]
            if c == "#":
                while pos < n and src[pos] not in "\r\n":
                    pos += 1
            elif c in " \t" or (newline_ok and c in "\r\n"):
                pos += 1
            else:
                break
        return pos

    @staticmethod
    def is_word_char(c: str) -> bool:
        return ("a" <= c <= "z") or ("A" <= c <= "Z") or ("0" <= c <= "9") or c == "-"

    def parse_name(self, pos: int) -> int:
        start = pos
        while pos < self.n and self.is_word_char(self.src[pos]):
            pos += 1
        if pos == start:
            raise _Invalid("expecting a rule name")
        return pos

    def parse_int(self, pos: int) -> int:
        start = pos
        while pos < self.n and "0" <= self.src[pos] <= "9":
            pos += 1
        if pos == start:
            raise _Invalid("expecting an integer")
        return pos

    def parse_char(self, pos: int) -> tuple[int, int]:
        """One character of a literal or class: (its code point, the position after it)."""
        c = self.ch(pos)
        if c == "\\":
            e = self.ch(pos + 1)
            size = {"x": 2, "u": 4, "U": 8}.get(e)
            if size is not None:
                digits = self.src[pos + 2 : pos + 2 + size]
                if len(digits) != size or not all(d in _HEX for d in digits):
                    raise _Invalid(f"expecting {size} hex digits after \\{e}")
                return int(digits, 16), pos + 2 + size
            if e in _SIMPLE_ESCAPES and e != "\0":
                return ord(_ESCAPED.get(e, e)), pos + 2
            raise _Invalid("unknown escape")
        if c != "\0":
            return ord(c), pos + 1
        raise _Invalid("unexpected end of input")

    def parse_token(self, pos: int) -> int:
        if self.ch(pos) != "<":
            raise _Invalid("expecting '<'")
        pos += 1
        if self.ch(pos) != "[":
            raise _Invalid(
                "a token given by its text (<...>): it must be exactly one token of the "
                "model's vocabulary, which the guard cannot check; use <[id]>"
            )
        pos += 1
        end = self.parse_int(pos)
        digits = self.src[pos:end]
        if len(digits.lstrip("0")) > 10 or int(digits) > _U32:
            raise _Invalid("token id too big")
        if self.ch(end) != "]":
            raise _Invalid("expecting ']'")
        if self.ch(end + 1) != ">":
            raise _Invalid("expecting '>'")
        return end + 2

    # -- symbols and rules --
    def get_symbol_id(self, name: str) -> int:
        return self.symbol_ids.setdefault(name, len(self.symbol_ids))

    def generate_symbol_id(self, base: str) -> int:
        next_id = len(self.symbol_ids)
        self.symbol_ids[f"{base}_{next_id}"] = next_id
        return next_id

    def terminal(self, bits: int) -> int:
        """A terminal item's ``ref``: -1 - the index of its first characters in ``terms``."""
        self.terms.append(bits)
        return -len(self.terms)

    def add_rule(self, rule_id: int, alternates: list[list[_Item]]) -> None:
        old = self.rules.get(rule_id)
        if old is not None:
            self.elements -= self._weight(old)
        self.rules[rule_id] = alternates
        self.elements += self._weight(alternates)
        if self.elements > self.limits.max_elements:
            raise RegexRejected(
                "guided_grammar_too_large",
                f"grammar expands to more than {self.limits.max_elements} elements in llama.cpp",
            )

    @staticmethod
    def _weight(alternates: list[list[_Item]]) -> int:
        return 4 + sum(1 + sum(e * k for _, e, k in alt) for alt in alternates)

    def parse_alternates(self, pos: int, rule_name: str, rule_id: int) -> int:
        """``parse_alternates`` of a rule, with its nested groups (``parse_sequence`` and
        ``parse_alternates`` recurse into each other in llama.cpp) on an explicit stack."""
        top = _Frame(rule_id, False, 0)
        frames = [top]
        while True:
            frame = frames[-1]
            pos = self.parse_sequence(pos, rule_name, frame, frames)
            if frames[-1] is not frame:
                continue  # entered a group
            if self.ch(pos) == "|":
                pos = self.parse_space(pos + 1, True)
                frame.seq = []
                frame.alternates.append(frame.seq)
                frame.last = 0
                frame.n_prev = 1
                continue
            self.add_rule(frame.rule_id, frame.alternates)
            if len(frames) == 1:
                return pos
            frames.pop()
            self.depth -= 1
            parent = frames[-1]
            if self.ch(pos) != ")":
                raise _Invalid("expecting ')'")
            parent.n_prev = max(1, len(self.symbol_ids) - frame.symbols_before)
            parent.last = len(parent.seq)
            parent.seq.append((frame.rule_id, 1, 1))
            pos = self.parse_space(pos + 1, parent.nested)

    def parse_sequence(self, pos: int, rule_name: str, frame: _Frame, frames: list[_Frame]) -> int:
        """Items of one alternative until a character that ends it; returns early, with a new
        frame on ``frames``, at a ``(``."""
        seq = frame.seq
        nested = frame.nested
        src = self.src
        while pos < self.n:
            c = src[pos]
            if c == '"':
                pos += 1
                frame.last = len(seq)
                frame.n_prev = 1
                count = 0
                first = 0
                while self.ch(pos) != '"':
                    if pos >= self.n:
                        raise _Invalid("unexpected end of input in a literal")
                    cp, pos = self.parse_char(pos)
                    if not count:
                        first = char_bits(cp, cp)
                    count += 1
                if count:
                    seq.append((self.terminal(first), count, 1))
                pos = self.parse_space(pos + 1, nested)
            elif c == "[":
                pos += 1
                negated = self.ch(pos) == "^"
                if negated:
                    pos += 1
                frame.last = len(seq)
                frame.n_prev = 1
                count = 0
                bits = 0
                while self.ch(pos) != "]":
                    if pos >= self.n:
                        raise _Invalid("unexpected end of input in a character class")
                    lo, pos = self.parse_char(pos)
                    hi = lo
                    count += 1
                    if self.ch(pos) == "-" and self.ch(pos + 1) != "]":
                        if pos + 1 >= self.n:
                            raise _Invalid("unexpected end of input in a character class")
                        hi, pos = self.parse_char(pos + 1)
                        count += 1
                    bits |= char_bits(lo, hi)
                if count:
                    seq.append((self.terminal(negate_bits(bits) if negated else bits), count, 1))
                pos = self.parse_space(pos + 1, nested)
            elif c in "<!":
                if c == "!":
                    pos += 1
                pos = self.parse_token(pos)
                frame.last = len(seq)
                frame.n_prev = 1
                seq.append((self.terminal(TOKEN_BIT), 1, 1))
                pos = self.parse_space(pos, nested)
            elif self.is_word_char(c):
                end = self.parse_name(pos)
                ref = self.get_symbol_id(src[pos:end])
                pos = self.parse_space(end, nested)
                frame.last = len(seq)
                frame.n_prev = 1
                seq.append((ref, 1, 1))
            elif c == "(":
                if self.depth >= self.limits.max_depth:
                    raise RegexRejected(
                        "guided_grammar_too_deep",
                        f"grammar groups nested more than {self.limits.max_depth} deep",
                    )
                pos = self.parse_space(pos + 1, True)
                before = len(self.symbol_ids)
                sub = self.generate_symbol_id(rule_name)
                self.depth += 1
                frames.append(_Frame(sub, True, before))
                return pos
            elif c == ".":
                frame.last = len(seq)
                frame.n_prev = 1
                seq.append((self.terminal(ANY_CHAR), 1, 1))
                pos = self.parse_space(pos + 1, nested)
            elif c in "*+?":
                pos = self.parse_space(pos + 1, nested)
                lo, hi = (0, _U64) if c == "*" else (1, _U64) if c == "+" else (0, 1)
                frame.n_prev = self.repeat(seq, frame.last, lo, hi, frame.n_prev, rule_name)
            elif c == "{":
                pos = self.parse_space(pos + 1, nested)
                if not ("0" <= self.ch(pos) <= "9"):
                    raise _Invalid("expecting an integer after '{'")
                end = self.parse_int(pos)
                lo = self.to_u64(src[pos:end])
                pos = self.parse_space(end, nested)
                hi = _U64
                if self.ch(pos) == "}":
                    hi = lo
                    pos = self.parse_space(pos + 1, nested)
                elif self.ch(pos) == ",":
                    pos = self.parse_space(pos + 1, nested)
                    if "0" <= self.ch(pos) <= "9":
                        end = self.parse_int(pos)
                        hi = self.to_u64(src[pos:end])
                        pos = self.parse_space(end, nested)
                    if self.ch(pos) != "}":
                        raise _Invalid("expecting '}'")
                    pos = self.parse_space(pos + 1, nested)
                else:
                    raise _Invalid("expecting ',' or '}' in a repetition")
                if lo > MAX_REPETITION_THRESHOLD:
                    raise _Invalid(f"a repetition of more than {MAX_REPETITION_THRESHOLD}")
                if hi != _U64 and hi > MAX_REPETITION_THRESHOLD:
                    hi = _U64
                frame.n_prev = self.repeat(seq, frame.last, lo, hi, frame.n_prev, rule_name)
            else:
                break
        return pos

    @staticmethod
    def to_u64(digits: str) -> int:
        """``std::stoull``: out of range throws."""
        if len(digits.lstrip("0")) > 20 or int(digits) > _U64:
            raise _Invalid("repetition count out of range")
        return int(digits)

    def repeat(
        self, seq: list[_Item], last: int, lo: int, hi: int, n_prev: int, rule_name: str
    ) -> int:
        """``handle_repetitions``: S{m,n} -> S (m times) S'(n-m), S'(x) ::= S S'(x-1) | ."""
        no_max = hi == _U64
        if last == len(seq):
            raise _Invalid("'*', '+', '?' or '{' with nothing before it")
        if not no_max and hi < lo:
            # llama.cpp computes n - m in 64 bits and unrolls ~2**64 rules: it never returns.
            raise _Invalid("a repetition {m,n} with n < m")
        total = hi if not no_max and hi > 0 else lo if lo > 0 else 1
        if n_prev * total > MAX_REPETITION_THRESHOLD:
            raise _Invalid(f"nested repetitions multiply to more than {MAX_REPETITION_THRESHOLD}")
        prev = seq[last:]
        if lo == 0:
            del seq[last:]
        elif lo > 1:
            if len(prev) == 1:
                ref, elems, copies = prev[0]
                seq[last] = (ref, elems, copies * lo)
            else:
                for _ in range(lo - 1):
                    seq.extend(prev)
        n_opt = 1 if no_max else hi - lo
        last_rec = 0
        for i in range(n_opt):
            rec_id = self.generate_symbol_id(rule_name)
            body = list(prev)
            if i > 0 or no_max:
                body.append((rec_id if no_max else last_rec, 1, 1))
            self.add_rule(rec_id, [body, []])
            last_rec = rec_id
        if n_opt > 0:
            seq.append((last_rec, 1, 1))
        return n_prev * total

    def parse_rule(self, pos: int) -> int:
        end = self.parse_name(pos)
        name = self.src[pos:end]
        pos = self.parse_space(end, False)
        rule_id = self.get_symbol_id(name)
        if self.src[pos : pos + 3] != "::=":
            raise _Invalid("expecting '::='")
        pos = self.parse_space(pos + 3, True)
        pos = self.parse_alternates(pos, name, rule_id)
        c = self.ch(pos)
        if c == "\r":
            pos += 2 if self.ch(pos + 1) == "\n" else 1
        elif c == "\n":
            pos += 1
        elif pos < self.n:
            raise _Invalid("expecting a newline or the end after a rule")
        return self.parse_space(pos, True)

    def parse(self) -> None:
        pos = self.parse_space(0, True)
        while pos < self.n:
            pos = self.parse_rule(pos)
        if not self.rules:
            raise _Invalid("an empty grammar")
        size = max(self.rules) + 1
        for rule_id in range(size):
            if rule_id not in self.rules:
                raise _Invalid("a rule referenced but not defined")
        for alternates in self.rules.values():
            for alt in alternates:
                for ref, _, _ in alt:
                    if ref >= size:
                        raise _Invalid("a rule referenced but not defined")
        if "root" not in self.symbol_ids:
            raise _Invalid("no 'root' rule")
        self.nullable = self.compute_nullable(size)
        self.check_hidden_left_recursion(size)
        self.check_left_recursion(size)
        self.check_ambiguous_recursion(size)
        self.check_live_stacks(size)

    def compute_nullable(self, size: int) -> list[bool]:
        """Which rules can match empty text (a fixpoint, unlike llama.cpp's "may be empty")."""
        rules = self.rules
        # Nullability by a worklist: a rule is nullable once one alternative has only
        # nullable references left.
        waiting: list[list[tuple[int, int]]] = [[] for _ in range(size)]
        missing: dict[tuple[int, int], int] = {}
        nullable = [False] * size
        todo: list[int] = []
        for rid in range(size):
            for a, alt in enumerate(rules[rid]):
                if any(ref < 0 for ref, _, _ in alt):
                    continue
                refs = {ref for ref, _, _ in alt}
                if not refs:
                    if not nullable[rid]:
                        nullable[rid] = True
                        todo.append(rid)
                    continue
                missing[(rid, a)] = len(refs)
                for ref in refs:
                    waiting[ref].append((rid, a))
        while todo:
            done = todo.pop()
            for key in waiting[done]:
                missing[key] -= 1
                if missing[key] == 0 and not nullable[key[0]]:
                    nullable[key[0]] = True
                    todo.append(key[0])
        return nullable

    def check_hidden_left_recursion(self, size: int) -> None:
        """Left recursion llama.cpp does not see (through a rule all of whose alternatives can
        match empty text, e.g. ``ws ::= [ ]*``) is expanded by ``llama_grammar_advance_stack``:
        harmless when every reference on the cycle ends its alternative, but a reference with
        anything after it pushes that continuation on every turn and the stacks grow until
        memory runs out (``term ::= ws expr ")"``, ``expr ::= term ...``: std::bad_alloc)."""
        rules = self.rules
        nullable = self.nullable
        edges: list[list[int]] = [[] for _ in range(size)]
        growing: list[tuple[int, int]] = []
        for rid in range(size):
            for alt in rules[rid]:
                for j, (ref, _, copies) in enumerate(alt):
                    if ref < 0:
                        break
                    edges[rid].append(ref)
                    if j < len(alt) - 1 or copies > 1:
                        growing.append((rid, ref))
                    if not nullable[ref]:
                        break
        self.left_edges = edges
        comp = sccs(edges)
        for rid, ref in growing:
            if comp[rid] == comp[ref]:
                raise _Invalid(
                    "left recursion through rules that can match empty text (llama.cpp "
                    "expands it until memory runs out)"
                )

    def check_ambiguous_recursion(self, size: int) -> None:
        """Two references in a row that can start with the same rule of the recursion they sit
        in, the first able to match empty text (``root ::= "[" root? root? "]"``, or JSON's
        ``array ::= "[" ws value?`` with a ``ws`` that may hold a value): llama.cpp keeps one
        parse stack per reading, without sharing, and each nesting level of such text can be
        read two ways, so its stacks double with every level generated. Masks then take
        seconds a token after a dozen tokens and memory follows (issue 24's
        backend-llamacpp-grammar campaign). Ambiguity in general cannot be decided; this is the
        shape that multiplies: which rules each reference can start with (its closure along
        the references at the left), intersected, within the recursion of the rule holding the
        pair. Linear in the items, with bit sets of rules."""
        rules = self.rules
        nullable = self.nullable
        # Starts: the rules a reference can begin with, itself included. The left graph may
        # have cycles (harmless ones pass the checks above): closed per strongly connected
        # component, in Tarjan's order (a component's successors are numbered before it).
        left_comp = sccs(self.left_edges)
        n_comp = max(left_comp, default=-1) + 1
        members = [0] * n_comp
        for rid in range(size):
            members[left_comp[rid]] |= 1 << rid
        closure = list(members)
        succ: list[set[int]] = [set() for _ in range(n_comp)]
        for rid in range(size):
            for ref in self.left_edges[rid]:
                if left_comp[ref] != left_comp[rid]:
                    succ[left_comp[rid]].add(left_comp[ref])
        for c in range(n_comp):
            for d in succ[c]:
                closure[c] |= closure[d]
        # The recursions: components of the whole reference graph that contain a cycle.
        refs: list[list[int]] = [
            sorted({ref for alt in rules[rid] for ref, _, _ in alt if ref >= 0})
            for rid in range(size)
        ]
        comp = sccs(refs)
        cyclic = [0] * (max(comp, default=-1) + 1)
        for rid in range(size):
            cyclic[comp[rid]] |= 1 << rid
        for rid in range(size):
            mask = cyclic[comp[rid]]
            if mask == 1 << rid and rid not in refs[rid]:
                continue  # not recursive
            for alt in rules[rid]:
                before = 0  # what the nullable references just before can start with
                for ref, _, copies in alt:
                    if ref < 0:
                        before = 0
                        continue
                    starts = closure[left_comp[ref]]
                    if before & starts & mask or (copies > 1 and nullable[ref] and starts & mask):
                        raise RegexRejected(
                            "guided_grammar_unsafe",
                            "two references in a row can begin the same recursive rule, the "
                            "first matching empty text: llama.cpp's parse stacks double with "
                            "each nesting level generated",
                        )
                    before = before | starts if nullable[ref] else 0

    def check_live_stacks(self, size: int) -> None:
        """Refuse a grammar that can keep more parse stacks alive at once than the budget: a
        repetition or alternation whose readings of the same text stay apart (``item+`` with
        ``item ::= [a-z]{1,999}``: any split of a run of letters into items is a reading, one
        stack per position in the counted repetition, and every token mask walks each)."""
        rules = [self.rules[rid] for rid in range(size)]
        peak = live_stacks(rules, self.terms, self.nullable, self.symbol_ids["root"])
        if peak > self.limits.max_stacks:
            raise RegexRejected(
                "guided_grammar_unsafe",
                "the same text can be read so many ways that llama.cpp may keep "
                f"{f'about {peak}' if peak < 10**6 else 'over a million'} parse stacks (or ways "
                f"through a token) alive at once, more than {self.limits.max_stacks}; each "
                "token mask walks every one",
            )

    def check_left_recursion(self, size: int) -> None:
        rules = self.rules
        # llama.cpp's "may be empty": the rule has an empty alternative (not a fixpoint: a rule
        # whose alternatives are all nullable references is not "empty" to it).
        nullable = [any(not alt for alt in rules[rid]) for rid in range(size)]
        # Leftmost references, with how often llama.cpp's check recurses into each.
        edges: list[list[tuple[int, int]]] = [[] for _ in range(size)]
        for rid in range(size):
            for alt in rules[rid]:
                for ref, _, copies in alt:
                    if ref < 0:
                        break
                    if nullable[ref]:
                        edges[rid].append((ref, copies))
                        continue
                    edges[rid].append((ref, 1))
                    break
        # Cycle detection and costs, iteratively (post-order DFS).
        state = [0] * size  # 0 new, 1 on the path, 2 done
        calls = [0] * size
        depth = [0] * size
        cap = self.limits.max_steps + 1
        for start in range(size):
            if state[start]:
                continue
            stack: list[tuple[int, int]] = [(start, 0)]
            state[start] = 1
            while stack:
                rid, i = stack[-1]
                out = edges[rid]
                if i < len(out):
                    stack[-1] = (rid, i + 1)
                    nxt = out[i][0]
                    if state[nxt] == 1:
                        raise _Invalid("left recursion (llama.cpp refuses it)")
                    if state[nxt] == 0:
                        state[nxt] = 1
                        stack.append((nxt, 0))
                    continue
                stack.pop()
                state[rid] = 2
                calls[rid] = min(cap, 1 + sum(calls[x] * k for x, k in out))
                depth[rid] = 1 + max((depth[x] for x, _ in out), default=0)
        # llama.cpp's outer loop: each rule not yet visited starts a full check.
        visited = [False] * size
        steps = 0
        for start in range(size):
            if visited[start]:
                continue
            steps += calls[start]
            if depth[start] > self.limits.max_left_depth:
                raise RegexRejected(
                    "guided_grammar_too_deep",
                    f"rule references nested more than {self.limits.max_left_depth} deep "
                    "at the left of a rule (llama.cpp recurses along them)",
                )
            if steps > self.limits.max_steps:
                raise RegexRejected(
                    "guided_grammar_too_large",
                    f"llama.cpp's left-recursion check would take more than "
                    f"{self.limits.max_steps} steps on this grammar",
                )
            todo = [start]
            visited[start] = True
            while todo:
                rid = todo.pop()
                for x, _ in edges[rid]:
                    if not visited[x]:
                        visited[x] = True
                        todo.append(x)


def parse_gbnf(text: str, limits: GbnfLimits) -> None:
    """Raise :class:`RegexRejected` (``guided_grammar_invalid``, ``..._too_deep``,
    ``..._too_large``) unless llama.cpp would accept ``text`` at a bounded cost."""
    parser = _Parser(text, limits)
    try:
        parser.parse()
    except _Invalid as e:
        raise RegexRejected(
            "guided_grammar_invalid", f"llama.cpp cannot parse this grammar: {e}"
        ) from None

"""Mutations of GBNF grammar text, aimed at what llama.cpp's parser and sampler get wrong.

Byte edits alone mostly break a grammar's syntax (a documented refusal, cheap and dull), so
most operators work on its structure: rules (``name ::= alternatives``, one a line), their
alternatives and items. They aim at the places llama.cpp's grammar code has failed before:
repetition unrolled into rules (``{m,n}``, nested counts), left recursion it detects and the
kind it misses (through rules that match empty text), exponential paths in its checks
(duplicated alternatives), deep group nesting, escapes and token references (``<[id]>``), line
endings and comments, a NUL (the C string ends there). Every operator keeps the result within
``max_size``; text is UTF-8 (what a JSON body can carry).
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from fuzz.targets._mutate import byte_mutate, grow_number

__all__ = ["GBNF_DICTIONARY", "gbnf_mutate", "rule_names"]

# Tokens of the GBNF language, for the byte-level dictionary mutator.
GBNF_DICTIONARY: tuple[bytes, ...] = (
    b"::=",
    b" ::= ",
    b"root ::= ",
    b"\nroot ::= ",
    b" | ",
    b"|",
    b"(",
    b")",
    b"*",
    b"+",
    b"?",
    b"{0}",
    b"{1}",
    b"{0,}",
    b"{1,}",
    b"{2,5}",
    b"{0,1}",
    b"{5,2}",
    b"{2000}",
    b"{2001}",
    b"{0,2000}",
    b"{1999,2000}",
    b"{99999999999999999999}",
    b'""',
    b'"a"',
    b'"\\""',
    b'"\\\\"',
    b'"\\x41"',
    b'"\\u00e9"',
    b'"\\U0001F600"',
    b'"\\U00110000"',
    b'"\\xZZ"',
    b'"\\d"',
    b'"\\b"',
    b"[a-z]",
    b"[^a]",
    b"[^]",
    b"[]",
    b"[\\x00-\\x7F]",
    b"[\\u0000-\\U0010FFFF]",
    b"[z-a]",
    b"[-]",
    b"[\\]]",
    b"[\\-]",
    b"[ \\t\\n]*",
    b".",
    b".*",
    b"<[0]>",
    b"<[1]>",
    b"!<[2]>",
    b"<[4294967295]>",
    b"<[4294967296]>",
    b"<eos>",
    b"<|im_end|>",
    b"#",
    b"# comment\n",
    b"\n",
    b"\r\n",
    b"\r",
    b"\t",
    b"\x00",
    b"ws",
    b"root",
    b"-",
    b"a-b",
    b"_x",
)

_RULE = re.compile(r"^([A-Za-z0-9_-]+)[ \t]*::=", re.MULTILINE)
# Items an alternative is made of: literals, classes, tokens, names, groups' brackets, '.'.
_ITEM = re.compile(
    r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|!?<[^>\n]*>|[A-Za-z0-9-]+|\.|[()]', re.DOTALL
)
_QUANTIFIERS = ("*", "+", "?", "{2}", "{0,3}", "{1,}", "{3,7}", "{16}", "{0,64}", "{100}")
_TERMINALS = ('"a"', '"ab"', '""', "[a-z]", "[^x]", ".", '"\\n"', "[0-9]", "<[1]>", '"é"')


def rule_names(text: str) -> list[str]:
    """The names defined in ``text``, in order (duplicates kept: llama.cpp lets one rule be
    defined twice, the last definition wins)."""
    return [m.group(1) for m in _RULE.finditer(text)]


def _fit(out: str, original: bytes, max_size: int) -> bytes:
    data = out.encode("utf-8", "surrogatepass")
    return data if len(data) <= max_size else original


def _rules(text: str) -> list[tuple[int, int, str]]:
    """(start, end, name) of each rule's text: from its name to the next rule's name."""
    starts = [(m.start(), m.group(1)) for m in _RULE.finditer(text)]
    return [
        (pos, starts[i + 1][0] if i + 1 < len(starts) else len(text), name)
        for i, (pos, name) in enumerate(starts)
    ]


def _rule_end(text: str, rule: tuple[int, int, str]) -> int:
    """Where a rule's last alternative ends (before its trailing newlines)."""
    start, end, _ = rule
    return start + len(text[start:end].rstrip("\r\n"))


def _fresh(names: Sequence[str], rng: random.Random) -> str:
    while True:
        name = f"r{rng.randrange(1000)}"
        if name not in names:
            return name


def _structural(text: str, rng: random.Random, donors: Sequence[str]) -> str | None:
    """One structural edit of ``text``, or None when it does not apply."""
    names = rule_names(text)
    rules = _rules(text)
    items = list(_ITEM.finditer(text))
    op = rng.randrange(12)
    if op == 0 and items:  # repeat an item (or a group of a few items) with a quantifier
        i = rng.randrange(len(items))
        j = min(len(items) - 1, i + rng.randrange(3))
        a, b = items[i].start(), items[j].end()
        body = text[a:b]
        if "(" in body or ")" in body:
            return text[:b] + rng.choice(_QUANTIFIERS) + text[b:]
        return text[:a] + "(" + body + ")" + rng.choice(_QUANTIFIERS) + text[b:]
    if op == 1 and rules:  # a rule that can match empty text: an empty alternative
        at = _rule_end(text, rng.choice(rules))
        return text[:at] + " | " + text[at:]
    if op == 2 and rules and names:  # a reference at the left of an alternative (recursion)
        start, end, _ = rng.choice(rules)
        head = text.find("::=", start) + 3
        at = rng.choice([head] + [head + m.end() for m in re.finditer(r"\|", text[head:end])])
        return text[:at] + " " + rng.choice(names) + " " + text[at:]
    if op == 3 and rules:  # a new rule, referenced from an existing one
        name = _fresh(names, rng)
        parts = [rng.choice([*names, *_TERMINALS]) for _ in range(1 + rng.randrange(3))]
        alts = [" ".join(parts)]
        if rng.random() < 0.5:
            alts.append(rng.choice([*names, *_TERMINALS, ""]))
        new = f"{name} ::= {' | '.join(alts)}\n"
        at = _rule_end(text, rng.choice(rules))
        return (text[:at] + " " + name + text[at:]).rstrip("\n") + "\n" + new
    if op == 4 and rules:  # duplicate an alternative: paths through the rule double
        start, end, _ = rng.choice(rules)
        head = text.find("::=", start) + 3
        body = text[head:end].rstrip("\n")
        alt = rng.choice(body.split("|")).strip() or '""'
        return text[: head + len(body)] + " | " + alt + text[head + len(body) :]
    if op == 5 and rules:  # a chain of rules each doubling the paths of the next
        depth = 2 + rng.randrange(24)
        base = _fresh(names, rng)
        chain = [f"{base}{k} ::= {base}{k + 1} | {base}{k + 1}" for k in range(depth)]
        chain.append(f"{base}{depth} ::= {rng.choice(_TERMINALS)}")
        return text.rstrip("\n") + f"\nroot ::= {base}0\n" + "\n".join(chain) + "\n"
    if op == 6 and rules:  # nest a rule's body in groups
        start, end, _ = rng.choice(rules)
        head = text.find("::=", start) + 3
        body = text[head:end].rstrip("\n")
        n = rng.choice((1, 2, 8, 64))
        return text[:head] + " " + "(" * n + body + ")" * n + text[head + len(body) :]
    if op == 7 and donors:  # splice a rule from another grammar
        donor = rng.choice(donors)
        drules = _rules(donor)
        if not drules:
            return None
        a, b, _ = rng.choice(drules)
        return text.rstrip("\n") + "\n" + donor[a:b].rstrip("\n") + "\n"
    if op == 8 and len(rules) > 1:  # swap two rules' bodies
        (s1, e1, _), (s2, e2, _) = sorted(rng.sample(rules, 2))
        h1, h2 = text.find("::=", s1) + 3, text.find("::=", s2) + 3
        b1, b2 = text[h1:e1], text[h2:e2]
        return text[:h1] + b2 + text[e1:h2] + b1 + text[e2:]
    if op == 9 and items:  # replace an item by a reference to a rule, or a terminal
        m = rng.choice(items)
        return text[: m.start()] + rng.choice([*names, *_TERMINALS]) + text[m.end() :]
    if op == 10:  # line endings and comments where the parser treats them specially
        at = rng.randrange(len(text) + 1)
        return text[:at] + rng.choice(("\r\n", "\r", "# c\n", "\n\n", "\\\n", "\x00")) + text[at:]
    if op == 11 and rules:  # rename a rule (or make root one of the others)
        _, _, name = rng.choice(rules)
        new = rng.choice(["root", *names, _fresh(names, rng), "a_b"])
        return re.sub(rf"(?<![A-Za-z0-9_-]){re.escape(name)}(?![A-Za-z0-9_-])", new, text, count=1)
    return None


def gbnf_mutate(
    data: bytes, max_size: int, rng: random.Random, donors: Sequence[str] = ()
) -> bytes:
    """One mutation of a GBNF grammar: structural (most of the time), numeric or byte-level."""
    op = rng.randrange(10)
    if op < 6:
        text = data.decode("utf-8", "replace")
        for _ in range(3):
            out = _structural(text, rng, donors)
            if out is not None and out != text:
                return _fit(out, data, max_size)
    if op < 8:
        return grow_number(data, max_size, rng)
    return byte_mutate(data, max_size, rng, GBNF_DICTIONARY)

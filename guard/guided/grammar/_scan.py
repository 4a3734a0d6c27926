"""Linear scans of grammar text (GBNF, EBNF, Lark) before an upstream parses it.

llama.cpp's GBNF parser recurses once per parenthesised group (``'(' * 60000`` overflows its
stack, issue 26600), recurses through nullable repetitions (``("a"*)*``, issue 18988) and
unrolls ``{m,n}`` into copies. Grammars for vLLM may be GBNF-like (xgrammar) or Lark
(llguidance, outlines), where ``[...]`` is an optional group rather than a character class, so
those are read both ways and the deeper reading counts. One regex tokenizer pass each, an
explicit stack of open groups, no recursion; refusals never quote the grammar.
"""

from __future__ import annotations

import re

from guard.errors import RegexRejected

_COUNT_CAP = 1 << 30


def _count(digits: str) -> int:
    if not digits:
        return 0
    return int(digits) if len(digits) <= 9 else _COUNT_CAP


_GBNF_TOKEN = re.compile(
    r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>"[^"\\]*(?:\\.[^"\\]*)*"?)
  | (?P<cls>\[[^\]\\]*(?:\\.[^\]\\]*)*\]?)
  | (?P<define>::=)
  | (?P<brace>\{\s*(?P<lo>\d*)\s*(?P<comma>,)?\s*(?P<hi>\d*)\s*\})
  | (?P<word>[A-Za-z0-9_.\-]+)
  | (?P<op>[()|*+?])
    """,
    re.VERBOSE | re.DOTALL,
)
# The other reading (Lark, EBNF): brackets of every kind nest; one-line strings, regex literals
# and // comments hide them; a rule definition starts at depth 0 (so a GBNF class such as
# [^"] read this way cannot carry its drift past its own rule).
_NEST_TOKEN = re.compile(
    r"""
    (?P<rule>^[ \t]*[?!]?[A-Za-z_][A-Za-z0-9_.\-]*[ \t]*(?:::=|:(?!:)))
  | "[^"\\\n]*(?:\\.[^"\\\n]*)*"?
  | //[^\n]*
  | /[^/\\\n]*(?:\\.[^/\\\n]*)*/?
  | [(\[{] | [)\]}]
    """,
    re.VERBOSE | re.MULTILINE,
)


class _GFrame:
    __slots__ = ("alt_nullable", "pending", "product", "seq_nullable")

    def __init__(self) -> None:
        self.alt_nullable = False
        self.seq_nullable = True
        self.pending: tuple[bool, int] | None = None  # (nullable, repetition product)
        self.product = 1

    def commit(self) -> None:
        if self.pending is not None:
            nullable, product = self.pending
            self.seq_nullable = self.seq_nullable and nullable
            self.product = max(self.product, product)
            self.pending = None


def scan_gbnf(
    text: str, *, max_depth: int, max_rules: int, max_repeat: int, max_repeat_total: int
) -> None:
    """llama.cpp's reading: ``"..."`` strings, ``[...]`` classes, ``#`` comments."""
    frames = [_GFrame()]
    rules = 0
    repeat_total = 0
    for m in _GBNF_TOKEN.finditer(text):
        kind = m.lastgroup
        frame = frames[-1]
        if kind == "comment":
            continue
        if kind in ("string", "cls", "word"):
            frame.commit()
            frame.pending = (kind == "string" and len(m.group()) == 2, 1)
        elif kind == "define":
            rules += 1
            if rules > max_rules:
                raise RegexRejected(
                    "guided_grammar_too_large",
                    f"grammar with more than {max_rules} rules",
                )
            if len(frames) == 1:
                frames[0] = _GFrame()  # a new rule; the pending word was its name
        elif kind == "brace" or (kind == "op" and m.group() in "*+?"):
            if frame.pending is None:
                continue  # nothing to repeat: llama.cpp refuses the grammar
            nullable, product = frame.pending
            if kind == "brace":
                lo = _count(m.group("lo"))
                hi: int | None = _count(m.group("hi")) if m.group("hi") else None
                if m.group("comma") is None:
                    hi = lo
                count = max(lo, hi or 0, 1)
            else:
                op = m.group()
                lo, hi, count = (
                    (0, None, 1) if op == "*" else (1, None, 1) if op == "+" else (0, 1, 1)
                )
            if hi is None and nullable:
                raise RegexRejected(
                    "guided_grammar_unsafe",
                    "a repetition whose body can match empty text (llama.cpp recurses without end)",
                )
            product *= count
            repeat_total += count if kind == "brace" else 0
            if product > max_repeat or repeat_total > max_repeat_total:
                raise RegexRejected(
                    "guided_grammar_too_large",
                    f"grammar repetitions expand beyond {max_repeat} copies"
                    if product > max_repeat
                    else f"grammar repetition counts add up to more than {max_repeat_total}",
                )
            frame.pending = (nullable or lo == 0, product)
        elif m.group() == "(":
            frame.commit()
            if len(frames) > max_depth:
                raise RegexRejected(
                    "guided_grammar_too_deep",
                    f"grammar groups nested more than {max_depth} deep",
                )
            frames.append(_GFrame())
        elif m.group() == ")":
            if len(frames) == 1:
                continue
            frames.pop()
            frame.commit()
            nullable = frame.alt_nullable or frame.seq_nullable
            parent = frames[-1]
            parent.commit()
            parent.pending = (nullable, frame.product)
        else:  # "|"
            frame.commit()
            frame.alt_nullable = frame.alt_nullable or frame.seq_nullable
            frame.seq_nullable = True


def scan_nesting(text: str, *, max_depth: int) -> None:
    depth = 0
    for m in _NEST_TOKEN.finditer(text):
        if m.lastgroup == "rule":
            depth = 0
            continue
        tok = m.group()
        if len(tok) != 1 or tok in '"/':
            continue
        if tok in "([{":
            depth += 1
            if depth > max_depth:
                raise RegexRejected(
                    "guided_grammar_too_deep",
                    f"grammar groups nested more than {max_depth} deep",
                )
        elif depth:
            depth -= 1

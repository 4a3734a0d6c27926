"""A linear pre-compile scan of a Jinja template: size, block nesting, bracket nesting, syntax tokens.

Jinja's lexer, parser and code generator are recursive and cost tens of microseconds per token, so
a hostile template must be measured before it is handed to them. The scan follows the lexer's
rules closely enough to be an upper bound (comments and ``raw`` blocks are skipped, closing
delimiters only count outside brackets, string literals use the lexer's own pattern) and stops at
the first limit crossed. Where the template is malformed the scan stops early and leaves the error
to Jinja's parser, which then fails on a prefix the scan has already measured.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from guard.errors import ScanLimitError
from guard.jinja._meters import ChatTemplateLimits

# ``{{``, ``{%`` or ``{#``: the three ways into a tag.
_OPEN = re.compile(r"\{[{%#]")
_COMMENT_END = re.compile(r"[-+]?#\}")
_ENDRAW = re.compile(r"\{%[-+]?\s*endraw\s*[-+]?%\}")
# One token inside a tag. Strings use the lexer's pattern (an unclosed quote is an error there, and
# here it ends the scan); closing delimiters are matched separately, only at bracket depth 0.
_TOKEN = re.compile(
    r"""
      (?P<ws>\s+)
    | (?P<name>[^\W\d]\w*)
    | (?P<number>\d[\w.]*)
    | (?P<string>'[^'\\]*(?:\\.[^'\\]*)*'|"[^"\\]*(?:\\.[^"\\]*)*")
    | (?P<op>.)
    """,
    re.S | re.X,
)
_VAR_END = re.compile(r"-?\}\}")
_BLOCK_END = re.compile(r"[-+]?%\}")

_OPENERS = frozenset({"for", "if", "macro", "call", "filter", "with", "block", "autoescape"})
_CLOSERS = frozenset({f"end{name}" for name in (*_OPENERS, "set")})


@dataclass(frozen=True)
class ScanStats:
    """What the scan measured; kept with a cached template so any limits can be rechecked."""

    source_bytes: int
    block_nesting: int
    expr_nesting: int
    syntax_tokens: int


def utf8_length_upper_bound_exceeds(source: str, limit: int) -> bool:
    """Whether ``source`` is over ``limit`` UTF-8 bytes, without encoding more than needed."""
    if len(source) > limit:
        return True
    if 4 * len(source) <= limit or source.isascii():
        return False
    return len(source.encode("utf-8", "surrogatepass")) > limit


def scan_template(source: str, limits: ChatTemplateLimits) -> ScanStats:
    """Measure ``source``; raise :class:`ScanLimitError` at the first limit crossed."""
    if utf8_length_upper_bound_exceeds(source, limits.max_source_bytes):
        size = len(source.encode("utf-8", "surrogatepass")) if len(source) < (1 << 24) else -1
        raise ScanLimitError("size", size, limits.max_source_bytes)
    scanner = _TemplateScanner(source, limits)
    scanner.run()
    return ScanStats(
        source_bytes=len(source.encode("utf-8", "surrogatepass")),
        block_nesting=scanner.max_blocks,
        expr_nesting=scanner.max_brackets,
        syntax_tokens=scanner.tokens,
    )


class _TemplateScanner:
    def __init__(self, source: str, limits: ChatTemplateLimits) -> None:
        self.src = source
        self.limits = limits
        self.blocks = 0
        self.max_blocks = 0
        self.max_brackets = 0
        self.tokens = 0

    def run(self) -> None:
        src = self.src
        pos = 0
        while True:
            m = _OPEN.search(src, pos)
            if m is None:
                return
            kind = src[m.start() + 1]
            if kind == "#":
                end = _COMMENT_END.search(src, m.end())
                if end is None:
                    return  # unclosed comment: Jinja reports it
                pos = end.end()
                continue
            result = self._tag(m.end(), block=kind == "%")
            if result is None:
                return
            pos, first_word, assigns = result
            if kind == "%":
                if first_word == "raw":
                    end = _ENDRAW.search(src, pos)
                    if end is None:
                        return
                    pos = end.end()
                elif first_word in _OPENERS or (first_word == "set" and not assigns):
                    self._enter_block()
                elif first_word in _CLOSERS:
                    self.blocks = max(0, self.blocks - 1)

    def _enter_block(self) -> None:
        self.blocks += 1
        if self.blocks > self.max_blocks:
            self.max_blocks = self.blocks
            if self.blocks > self.limits.max_block_nesting:
                raise ScanLimitError("block", self.blocks, self.limits.max_block_nesting)

    def _count_token(self) -> None:
        self.tokens += 1
        if self.tokens > self.limits.max_syntax_tokens:
            raise ScanLimitError("tokens", self.tokens, self.limits.max_syntax_tokens)

    def _tag(self, pos: int, *, block: bool) -> tuple[int, str | None, bool] | None:
        """Scan one tag's body from ``pos``; return (end, first word, has a top-level ``=``)."""
        src = self.src
        end_re = _BLOCK_END if block else _VAR_END
        # Whitespace control right after the opener.
        if pos < len(src) and src[pos] in "-+":
            pos += 1
        self._count_token()
        depth = 0
        first_word: str | None = None
        seen_token = False
        assigns = False
        max_expr = self.limits.max_expr_nesting
        while True:
            if depth == 0:
                close = end_re.match(src, pos)
                if close is not None:
                    return close.end(), first_word, assigns
            m = _TOKEN.match(src, pos)
            if m is None:
                return None  # end of input inside a tag
            group = m.lastgroup
            pos = m.end()
            if group == "ws":
                continue
            self._count_token()
            if group == "name":
                if not seen_token:
                    first_word = m.group()
            elif group == "op":
                ch = m.group()
                if ch in "([{":
                    depth += 1
                    if depth > self.max_brackets:
                        self.max_brackets = depth
                        if depth > max_expr:
                            raise ScanLimitError("expr", depth, max_expr)
                elif ch in ")]}":
                    depth = max(0, depth - 1)
                elif ch == "=" and depth == 0:
                    before = src[m.start() - 1] if m.start() > 0 else ""
                    after = src[pos] if pos < len(src) else ""
                    if before not in "=!<>" and after != "=":
                        assigns = True
                elif ch in "'\"":
                    return None  # unclosed string literal: a syntax error for Jinja too
            seen_token = True

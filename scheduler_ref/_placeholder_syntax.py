"""Parsing ``{{name}}`` prompt templates into nodes, iteratively (no Python recursion).

The grammar is a PEG, parsed with an explicit stack::

    template    <- part*
    part        <- placeholder / "{{" / "}}" / text        (lenient reading)
    placeholder <- "{{" (placeholder / text)* "}}"

Delimiters are tokenised as :mod:`guard.template_scan` does (leftmost ``{{``/``}}``, no
overlap), so the guard and the engine agree on where every placeholder starts and ends.

Two readings, chosen by the profile:

- **lenient** (the vulnerable profile): an opener that is never closed is not an error. Like any
  PEG parser without memoisation, the engine backtracks: the innermost open placeholder fails at
  the end of the text, its opener is re-read as literal text, and parsing resumes right after it,
  re-parsing everything that follows. Each unclosed opener doubles the work (``2**k`` for ``k`` of
  them: the seed payload has 512). The work thrown away is not freed: every node goes into an
  arena that is never rolled back, and literal text is pre-tokenised into the token buffer as it
  is parsed, which is never rolled back either. So the engine's own parsing consumes memory until
  something kills it. A stray ``}}`` is literal text.
- **strict** (the hardened profile, after :func:`guard.template_scan.check_template`): an unclosed
  opener or a stray closer raises ``template_unbalanced``. On balanced text the two readings
  build the same nodes in one linear pass; the strict one simply never backtracks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from guard.errors import TemplateError
from guard.template_scan import DELIMITER, TEMPLATE_UNBALANCED


@dataclass(frozen=True, slots=True)
class Text:
    text: str


@dataclass(slots=True)
class Placeholder:
    """``{{ ... }}``: its parts render to the variable's name (inner placeholders first)."""

    offset: int
    parts: list[TemplatePart] = field(default_factory=list)


TemplatePart = Text | Placeholder


class Arena:
    """Owns every node the parser allocates, and the byte-level token buffer.

    The engine pre-tokenises literal text while parsing (so rendering only has to tokenise
    variable values) with a byte-level tokeniser: one token per UTF-8 byte, stored one byte each.
    Neither list is rolled back when the lenient parser backtracks.
    """

    __slots__ = ("nodes", "tokens")

    def __init__(self) -> None:
        self.nodes: list[TemplatePart] = []
        self.tokens = bytearray()

    def text(self, text: str) -> Text:
        node = Text(text)
        self.nodes.append(node)
        self.tokens += text.encode("utf-8", "surrogatepass")
        return node

    def placeholder(self, offset: int) -> Placeholder:
        node = Placeholder(offset)
        self.nodes.append(node)
        return node


def parse(template: str, arena: Arena, *, lenient: bool) -> list[TemplatePart]:
    """Parse ``template`` into a list of nodes allocated from ``arena``."""
    root: list[TemplatePart] = []
    open_: list[Placeholder] = []  # placeholders whose closer has not been read yet
    parts = root
    pos = 0
    n = len(template)
    search = DELIMITER.search
    while True:
        m = search(template, pos)
        stop = n if m is None else m.start()
        if stop > pos:
            parts.append(arena.text(template[pos:stop]))
        if m is None:
            if not open_:
                return root
            failed = open_.pop()
            if not lenient:
                raise TemplateError(
                    TEMPLATE_UNBALANCED,
                    f"template has '{{{{' at character {failed.offset} that is never closed",
                )
            # Ordered choice: the placeholder alternative failed, so take the opener as text
            # and parse again from just after it.
            parts = open_[-1].parts if open_ else root
            parts.append(arena.text("{{"))
            pos = failed.offset + 2
            continue
        pos = m.end()
        if template[stop] == "{":
            node = arena.placeholder(stop)
            open_.append(node)
            parts = node.parts
        elif open_:
            node = open_.pop()
            parts = open_[-1].parts if open_ else root
            parts.append(node)
        elif lenient:
            parts.append(arena.text("}}"))
        else:
            raise TemplateError(
                TEMPLATE_UNBALANCED,
                f"template has '}}}}' without a matching '{{{{' at character {stop}",
            )

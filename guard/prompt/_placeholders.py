"""A bound on what a ``{{name}}`` prompt template expands to, computed without expanding it.

Variable values are templates too (see ``scheduler_ref.prompt_template``): a value may refer to
other variables, to itself (expanding forever in a naive engine) or, billion-laughs style, to a
variable ten times that refers to another ten times, and so on. Expanding to find out is the
attack. Instead, each source (the template and every value) is read once for its placeholders,
and a table over (nesting depth, variable) gives, for every variable expanded at every depth:

- whether the expansion stays within the depth limit (placeholders in values count from the
  depth of the placeholder that expanded them, as the scheduler counts them);
- an upper bound on the characters it outputs (or, weighing text by its tokens, on the tokens)
  and on the placeholders it expands.

A placeholder whose name is itself built from placeholders (``{{ {{lang}}_greeting }}``) may
name any variable: it is given the worst of them at its depth. Unknown names (the upstream's
default variables) count as empty. Cost: ``max_depth`` times the number of placeholders.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import islice

from guard.template_scan import DELIMITER
from guard.tokens import TokenCounter

__all__ = [
    "Expansion",
    "Source",
    "bound_expansion",
    "expansion_tokens",
    "expansion_weight",
    "parse_source",
]


@dataclass(frozen=True, slots=True)
class Source:
    """The placeholders of one balanced template source.

    ``refs``: the placeholders as (nesting depth in this source, literal name or ``None`` when
    the name is built from inner placeholders, how many times that pair occurs), in order of
    first occurrence; only depth-1 ones output their value. Repeats are counted, not listed:
    a billion-laughs value repeats one placeholder twenty times, and the bound multiplies.
    ``literal``: the weight of the text outside every placeholder (its characters, or its tokens
    when parsed with a token-counting ``weigh``).
    """

    literal: int
    max_depth: int
    refs: tuple[tuple[int, str | None, int], ...]


def parse_source(text: str, weigh: Callable[[str], int] = len) -> Source:
    """Read ``text``'s placeholders (it must be balanced: scan it first); ``weigh`` measures
    each run of literal text (characters by default)."""
    if "{{" not in text:
        return Source(weigh(text), 0, ())
    by_length = weigh is len
    if by_length:
        flat = _flat_source(text)
        if flat is not None:
            return flat
    stack: list[tuple[int, bool]] = []  # (index after the opener, holds a nested placeholder)
    literal = 0
    last = 0
    deepest = 0
    refs: dict[tuple[int, str | None], int] = {}
    for m in DELIMITER.finditer(text):
        if m.group() == "{{":
            if stack:
                stack[-1] = (stack[-1][0], True)
            else:
                literal += m.start() - last if by_length else weigh(text[last : m.start()])
            stack.append((m.end(), False))
            deepest = max(deepest, len(stack))
        elif stack:
            start, nested = stack.pop()
            name = None if nested else text[start : m.start()].strip()
            ref = (len(stack) + 1, name)
            refs[ref] = refs.get(ref, 0) + 1
            if not stack:
                last = m.end()
    if not stack:
        literal += len(text) - last if by_length else weigh(text[last:])
    return Source(literal, deepest, _listed(refs))


def _listed(refs: dict[tuple[int, str | None], int]) -> tuple[tuple[int, str | None, int], ...]:
    """``Source.refs`` from counts of (depth, name), in first-occurrence order."""
    return tuple((depth, name, times) for (depth, name), times in refs.items())


def _flat_source(text: str) -> Source | None:
    """:func:`parse_source` by length for a balanced text whose placeholders do not nest, in C
    passes; None when they nest. Split at the openers, each piece is one placeholder's name,
    its closer and the literal text after it; equal pieces (a flooded template repeats one)
    are counted together, so the Python loop runs once per distinct piece."""
    refs: dict[tuple[int, str | None], int] = {}
    delimited = 0
    counted = Counter(islice(text.split("{{"), 1, None))
    for piece, times in counted.items():  # first occurrences in order
        name, closer, after = piece.partition("}}")
        if not closer or "}}" in after:
            return None  # an opener inside a placeholder (or not one closer per opener)
        delimited += (len(name) + 4) * times
        ref = (1, name.strip())
        refs[ref] = refs.get(ref, 0) + times
    return Source(len(text) - delimited, 1, _listed(refs))


@dataclass(frozen=True, slots=True)
class Expansion:
    """Upper bounds for one template: ``size`` of the output (in the sources' weights) and
    placeholders expanded; ``too_deep`` names the variable through which the depth limit is
    crossed (``""`` for the template itself), ``None`` when it is not."""

    size: int
    expansions: int
    too_deep: str | None


@dataclass(slots=True)
class _Level:
    ok: dict[str, bool]
    size: dict[str, int]
    expansions: dict[str, int]
    all_ok: bool = True
    max_size: int = 0
    max_expansions: int = 0


def _evaluate(
    source: Source, base: int, levels: list[_Level], variables: Mapping[str, Source], cap: int
) -> tuple[bool, int, int, str | None]:
    """(within depth, size, expansions, first failing variable) of ``source`` at ``base``."""
    size = source.literal
    expansions = 0
    for depth, name, times in source.refs:
        level = levels[base + depth]
        if name is None:
            ok, c, e = level.all_ok, level.max_size, level.max_expansions
        elif name in variables:
            ok, c, e = level.ok[name], level.size[name], level.expansions[name]
        else:
            ok, c, e = True, 0, 0
        if not ok:
            return False, 0, 0, name or ""
        # As many additions one by one, each capped: the counts are never negative.
        expansions = min(cap, expansions + times * (1 + e))
        if depth == 1:
            size = min(cap, size + times * c)
    return True, size, expansions, None


def bound_expansion(
    template: Source, variables: Mapping[str, Source], max_depth: int, cap: int
) -> Expansion:
    """Bounds for ``template`` expanded with ``variables`` under ``max_depth``; counts stop
    growing at ``cap`` (so nothing here grows with the expansion)."""
    if template.max_depth > max_depth:
        return Expansion(0, 0, "")
    if not template.refs:
        return Expansion(template.literal, 0, None)
    levels: list[_Level] = [_Level({}, {}, {}) for _ in range(max_depth + 1)]
    # Variables expanded at depth `base` (by a placeholder at that depth), deepest first.
    for base in range(max_depth, 0, -1):
        level = levels[base]
        for name, source in variables.items():
            if base + source.max_depth > max_depth:
                ok, c, e = False, 0, 0
            else:
                ok, c, e, _ = _evaluate(source, base, levels, variables, cap)
            level.ok[name] = ok
            level.size[name] = c
            level.expansions[name] = e
            if ok:
                level.max_size = max(level.max_size, c)
                level.max_expansions = max(level.max_expansions, e)
            else:
                level.all_ok = False
    ok, size, expansions, culprit = _evaluate(template, 0, levels, variables, cap)
    return Expansion(size, expansions, None if ok else culprit)


def expansion_weight(
    template: str,
    variables: Mapping[str, str],
    weigh: Callable[[str], int],
    max_depth: int,
    cap: int,
) -> int:
    """An upper bound on the weight of ``template`` expanded with ``variables`` (``weigh``
    measures literal text: bytes, or tokens); one nested too deep, which the templates check
    refuses, weighs its text once."""
    sources = {name: parse_source(value, weigh) for name, value in variables.items()}
    bound = bound_expansion(parse_source(template, weigh), sources, max_depth, cap)
    if bound.too_deep is not None:
        return min(cap, weigh(template) + sum(weigh(v) for v in variables.values()))
    return bound.size


# Literal runs at most this long are weighed by their bytes (a sound upper bound on their tokens),
# so a template of many tiny runs costs few tokenizer calls.
_SMALL_RUN = 64


def expansion_tokens(
    template: str, variables: Mapping[str, str], counter: TokenCounter, max_depth: int, cap: int
) -> int:
    """:func:`expansion_weight` in tokens: literal runs counted (short ones weighed by their
    bytes where they bound the tokens); at least ``cap`` once the expansion reaches it."""

    def weigh(text: str) -> int:
        if len(text) <= _SMALL_RUN and counter.byte_bounds:
            size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
            if size <= _SMALL_RUN:
                return size
        return counter.measure(text, cap, exact=True).tokens

    return expansion_weight(template, variables, weigh, max_depth, cap)

"""Scans that check JSON structure in C, before anything is parsed or built.

A loop over characters in Python scans a few MB/s; ``re`` and ``bytes`` methods run in C. A
regular expression cannot count without bound, but every limit here is bounded, so a pattern
nested ``max_depth`` times recognises the bodies whose nesting, container sizes and string
lengths are within limits. Numbers, containers in total and ``NaN`` are found with
``bytes.translate``/``find``/``count`` and a quote count to skip hits inside strings.

Rules that keep the patterns linear and fast (measured in bench/json_scan.py):

- Every quantifier is possessive (``*+``, ``{m,n}+``): nothing is ever retried.
- The scan runs on a *neutralised* copy of the body (same length, so offsets agree) in which
  ``\\\\`` and ``\\"`` are rewritten, so strings are plain ``"[^"]*"`` runs.
- Capture groups appear only where a violation is found; the match then swallows the rest of
  the input in O(1) with ``(?s:.*+)``. ``re`` copies every set group on each backtrack point,
  so groups set during a normal scan would cost up to 10x on dense input. After a match,
  ``lastindex`` names the violation and its group's start is just past the offending byte.
- Each alternative starts with a literal or a character class, which ``re`` checks without
  entering the branch.
"""

from __future__ import annotations

import math
import re
import threading
from dataclasses import dataclass
from functools import lru_cache

# The deepest nesting a pattern supports: compiling nests Python's recursive regex parser about
# four frames per level. Deeper JSON is never needed for an API request body.
MAX_SUPPORTED_DEPTH = 128

# Swallow the rest of the input without looking at it: ``re`` jumps to the end for ``.*`` under
# DOTALL, so reporting a violation costs nothing more.
_REST = rb"(?s:.*+)"
# Marks a long string whose exact decoded length was verified; see mark_verified().
VERIFIED = 0x00

_LONE_SURROGATE = re.compile(
    # A high surrogate escape not followed by a low one, or a low one not preceded by a high
    # one. Runs on the neutralised body, where every remaining ``\u`` is a real escape.
    rb"\\u[dD](?:[89abAB][0-9a-fA-F]{2}(?!\\u[dD][c-fC-F])"
    rb"|[c-fC-F][0-9a-fA-F]{2}(?<!\\u[dD][89abAB][0-9a-fA-F]{2}\\u[dD][c-fC-F][0-9a-fA-F]{2}))"
)
# Number characters to "0", everything else to " ": long numbers become long runs of zeros,
# which ``bytes.find`` locates at memory speed. Outside strings these characters occur only in
# numbers (a literal's trailing ``e`` is followed by a separator in valid JSON).
_NON_FINITE = re.compile(rb"-?(?:NaN|Infinity)")
# A number literal (JSON's grammar, a little more lenient): only called once the parser has met
# one that overflows, to say where it is.
_NUMBER = re.compile(rb"-?[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_CHARS = bytes(0x30 if chr(b) in "0123456789.eE+-" else 0x20 for b in range(256))


def neutralise(body: bytes) -> bytes:
    """The body with escaped backslashes and quotes rewritten, so quotes delimit strings.

    ``\\\\`` becomes ``\\_`` and ``\\"`` becomes ``\\_``: the same length, so offsets agree,
    and a backslash stays in place so a string that had escapes still looks escaped.
    ``bytes.replace`` pairs backslashes left to right, as a JSON string does.
    """
    if b"\\" not in body:
        return body
    return body.replace(b"\\\\", b"\\_").replace(b'\\"', b"\\_")


def find_lone_surrogate(scan: bytes) -> int:
    """Offset of the first ``\\uD800``-``\\uDFFF`` escape that is not half of a pair, or -1."""
    if b"\\" not in scan or b"\\u" not in scan:  # memchr first: far faster than a 2-byte search
        return -1
    m = _LONE_SURROGATE.search(scan)
    return -1 if m is None else m.start()


class _Outside:
    """Tells whether offsets, visited in increasing order, are outside strings, by counting
    quotes incrementally (one linear pass in all)."""

    def __init__(self, scan: bytes) -> None:
        self.scan = scan
        self.quotes = 0
        self.counted_to = 0

    def __call__(self, offset: int) -> bool:
        self.quotes += self.scan.count(b'"', self.counted_to, offset)
        self.counted_to = offset
        return self.quotes % 2 == 0


def find_long_number(scan: bytes, max_chars: int) -> int:
    """Offset of the first number token longer than ``max_chars`` outside strings, or -1."""
    if max_chars >= len(scan):
        return -1
    runs = scan.translate(_NUMBER_CHARS)
    needle = b"0" * (max_chars + 1)
    outside = _Outside(scan)
    found = runs.find(needle)
    while found >= 0:  # each hit starts a run (the search resumes after the previous run)
        if outside(found):
            return found
        after = runs.find(b" ", found)
        if after < 0:
            return -1
        found = runs.find(needle, after)
    return -1


def find_non_finite(scan: bytes) -> int:
    """Offset of the first ``NaN``, ``Infinity`` or ``-Infinity`` outside strings, or -1."""
    outside = _Outside(scan)  # called only once the parser has met one
    for hit in _NON_FINITE.finditer(scan):
        if outside(hit.start()):
            return hit.start()
    return -1


def find_overflowing_number(scan: bytes) -> int:
    """Offset of the first number outside strings whose value overflows a double (``1e999``,
    ``-1E+400``, an integer of more than 308 digits), or -1."""
    outside = _Outside(scan)  # called only once the parser has met one
    for hit in _NUMBER.finditer(scan):
        if math.isinf(float(hit.group())) and outside(hit.start()):
            return hit.start()
    return -1


def find_container(scan: bytes, ordinal: int, openers: int | None = None) -> int:
    """Offset of the ``ordinal``-th ``[`` or ``{`` outside strings (1-based), or -1.

    Counting both brackets over the whole body (``openers``, when the caller has counted them)
    is a quick upper bound; only a body over it is matched exactly, in C, by one counted
    pattern.
    """
    if openers is None:
        openers = count_openers(scan)
    if openers < ordinal:
        return -1
    m = re.compile(rb'(?:(?:[^"\[{]++|"[^"]*+(?:"|\Z))*+[\[{]){%d}' % ordinal).match(scan)
    return -1 if m is None else m.end() - 1


def count_openers(scan: bytes) -> int:
    """``[`` and ``{`` in ``scan``, strings included: an upper bound on its containers."""
    return scan.count(b"[") + scan.count(b"{")


@dataclass(frozen=True)
class Violation:
    """The first limit the scan found crossed: its kind and the byte offset of the culprit."""

    kind: str  # "depth", "members", "string" or "unverified_string"
    offset: int


@dataclass(frozen=True)
class StructureScan:
    """A compiled structural scan for one set of limits."""

    pattern: re.Pattern[bytes]
    kinds: dict[int, str]  # group index -> violation kind
    member: bytes = b""  # the source of one member's tokens, for members_end()

    def run(self, scan: bytes, endpos: int) -> Violation | None:
        """The first violation before ``endpos``, or None if there is none.

        Brackets that do not match stop the scan early without a violation: the body is then
        not valid JSON and the parser, which never reads past its first error, says so.
        Containers still open at ``endpos`` are fine (the scan treats it as the end).
        """
        m = self.pattern.match(scan, 0, endpos)
        if m is None or m.lastindex is None:
            return None
        # The group is empty and sits just past the byte that crossed the limit.
        return Violation(self.kinds[m.lastindex], m.start(m.lastindex) - 1)

    def member_end(self, scan: bytes, pos: int, endpos: int) -> int:
        """End of the container member (or top-level value) at ``pos``, reading up to endpos.

        Used only to locate an error: the pattern also matches one member, skipping any
        nested structure in C.
        """
        m = self.pattern.match(scan, pos, endpos)
        return pos if m is None else m.end()

    def members_end(self, scan: bytes, pos: int, endpos: int, count: int) -> int:
        """End of the next ``count`` members after ``pos``, each opening with its comma, in one
        match; -1 when fewer follow before the container ends. Used only to locate an error in
        a long container, so the patterns (one per count) are compiled on first use."""
        m = _members(self.member, count).match(scan, pos, endpos)
        return -1 if m is None else m.end()


def structure_scan(max_depth: int, max_members: int, max_string: int) -> StructureScan:
    """The scan for these limits, compiled once and cached."""
    return _compiled(max_depth, max_members, max_string)


@lru_cache(maxsize=16)
def _compiled(max_depth: int, max_members: int, max_string: int) -> StructureScan:
    member = _value(0, max_depth, max_members, max_string) + b"*+"
    pattern = _compile_off_stack(b",?" + member)
    kinds = {index: name.rstrip("0123456789") for name, index in pattern.groupindex.items()}
    return StructureScan(pattern, kinds, member)


@lru_cache(maxsize=16)
def _members(member: bytes, count: int) -> re.Pattern[bytes]:
    return _compile_off_stack(b"(?:,%s){%d}+" % (member, count))


def _value(level: int, depth: int, members: int, string: int) -> bytes:
    """One token at nesting ``level``: a string, a run of scalars and punctuation, or a whole
    container. Group names end in the level only to be unique."""
    alts = [
        # Strings. Raw length bounds decoded length from above (an escape never decodes to
        # more bytes than it takes), so a short raw string is within the limit. A long one
        # with no escape early on is over it; any other long string is measured exactly in
        # Python and then marked VERIFIED in its first content byte.
        rb'"(?:[^"]{0,%d}+(?:"|\Z)|\x00[^"]*+(?:"|\Z)|(?=[^"\\]{%d})(?P<string%d>)%s'
        rb"|(?P<unverified_string%d>)%s)" % (string, string + 1, level, _REST, level, _REST),
        # Numbers, literals, whitespace and colons (numbers are checked by find_long_number).
        rb'[^\[\]{}",][^\[\]{}",]*+',
    ]
    if level == depth:
        alts.append(rb"[\[{](?P<depth>)" + _REST)
    else:
        # Members are counted by iterations: the first needs no comma, each later one starts
        # with one. An empty iteration ends the loop, so ``[]`` is one empty member. An empty
        # container is tried first, as one class test: dense ``[],{}`` bodies cost a third.
        inner = _value(level + 1, depth, members, string)
        alts.append(
            rb"[\[{](?:[\]}]|(?:,?%s*+){1,%d}+(?:,(?P<members%d>)%s)?(?:[\]}]|\Z))"
            % (inner, members, level + 1, _REST)
        )
    return b"(?:" + b"|".join(alts) + b")"


@lru_cache(maxsize=16)
def depth_scan(max_depth: int) -> re.Pattern[bytes]:
    """Nesting alone, for json_depth(). Group ``level<i>`` is set once level i is entered (the
    only groups set during the scan; few, so cheap), ``depth`` marks the bracket that crossed,
    and ``unclosed<i>`` a container still open at the end."""
    token = rb'"[^"]*+"|[^\[\]{}"][^\[\]{}"]*+|'
    body = rb"[\[{](?P<depth>)" + _REST
    for level in range(max_depth, 0, -1):
        body = rb"[\[{](?P<level%d>)(?:%s%s)*+(?:[\]}]|\Z(?P<unclosed%d>))" % (
            level,
            token,
            body,
            level,
        )
    return _compile_off_stack(rb"(?:%s%s)*+" % (token, body))


def mark_verified(scan: bytes, openings: list[int]) -> bytes:
    """``scan`` with each string opening at one of ``openings`` marked as verified."""
    marked = bytearray(scan)
    for quote in openings:
        marked[quote + 1] = VERIFIED
    return bytes(marked)


def long_strings(scan: bytes, max_string: int) -> list[int]:
    """Opening quotes of the strings whose raw form is longer than ``max_string`` bytes.

    The pattern finds long runs right after a quote; counting quotes tells a string from a long
    stretch between strings. Runs are longer than the limit, so there are few of them.
    """
    outside = _Outside(scan)
    return [
        run.start() - 1 for run in _long_runs(max_string).finditer(scan) if not outside(run.start())
    ]


@lru_cache(maxsize=16)
def _long_runs(max_string: int) -> re.Pattern[bytes]:
    return re.compile(rb'(?<=")[^"]{%d,}' % (max_string + 1))


def _compile_off_stack(source: bytes) -> re.Pattern[bytes]:
    # The regex parser recurses ~4 frames per nesting level; compile on a fresh thread so the
    # caller's own stack depth cannot push it past the recursion limit.
    result: list[re.Pattern[bytes]] = []
    error: list[BaseException] = []

    def compile_() -> None:
        try:
            result.append(re.compile(source))
        except BaseException as exc:  # re-raised in the caller's thread
            error.append(exc)

    worker = threading.Thread(target=compile_, name="json-scan-compile")
    worker.start()
    worker.join()
    if error:
        raise error[0]
    return result[0]

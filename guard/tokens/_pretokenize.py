"""Positions where a text can be cut without changing its BPE token count.

Byte-level BPE tokenizers first cut the text into pieces with a regex and run BPE inside each
piece. A position ``p`` is a *safe split* when tokenizing ``text[:p]`` and ``text[p:]`` separately
gives exactly the pieces of the whole text: then ``count(text) == count(text[:p]) +
count(text[p:])``. The rules below are local conditions on a few bytes around ``p``; each was
derived from the regex (alternative by alternative) and is checked by property tests that compare
chunked and whole counts. They hold for any continuation of the text, so they also serve
streaming input.

cl100k (tiktoken) pattern, ``'(?i:[sdmt]|ll|ve|re)|[^\\r\\n\\p{L}\\p{N}]?+\\p{L}++|\\p{N}{1,3}+|
 ?[^\\s\\p{L}\\p{N}]++[\\r\\n]*+|\\s++$|\\s*[\\r\\n]|\\s+(?!\\S)|\\s`` (and Llama 3's equivalent
spelling without possessive quantifiers). ``WS`` is Unicode White_Space, what ``\\s`` matches.

- A: ``t[p-1]`` is an ASCII letter, ``t[p]`` an ASCII non-letter. Letter runs end there, and no
  alternative puts a letter before a non-letter in one piece.
- B: ``t[p-1]`` is an ASCII digit, ``t[p]`` an ASCII non-digit (digit groups of three start at the
  start of the digit run, which the split does not move).
- C: ``t[p-1]`` is not WS, ``t[p]`` is WS other than CR/LF. Only the punctuation alternative can
  continue into whitespace, and only into CR/LF.
- D: ``t[p-1]`` is CR or LF, ``t[p]`` is not WS. The whitespace piece before ends at its last
  CR/LF (``\\s*[\\r\\n]``), and alone it is the same span (``\\s++$``).
- I: ``t[p-2]`` and ``t[p-1]`` are ASCII punctuation, ``t[p]`` an ASCII letter or digit: a
  punctuation run of two or more cannot be the one-character prefix of a word.
- E: ``t[p-1]`` and ``t[p]`` are WS other than CR/LF, ``t[p+1]`` is not WS, and the whitespace run
  that ends at ``p`` holds no CR/LF: ``\\s+(?!\\S)`` ends the piece at ``p`` (the last space goes
  with the next word), and alone the run is ``\\s++$``, the same span.
- H: ``t[p-1]`` is CR or LF, and from ``p`` a run of WS without CR/LF is followed by a non-WS
  character: the piece before ends at its last CR/LF, which is ``p - 1``.

GPT-2 pattern (HF ``ByteLevel`` default), ``'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+|
 ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+``: rules A, B, I, and C' (``t[p-1]`` not WS, ``t[p]`` any WS).
Rule D does not hold there: ``"\\n\\nx"`` is pieces ``"\\n", "\\n", "x"`` but ``"\\n\\n"`` alone is
one piece.

Work happens on the UTF-8 bytes and a parallel *class* string (one byte per byte of text) so that
candidate positions are found with C-speed ``bytes.find``; non-ASCII neighbours are decoded only
for the few candidates that need them.
"""

from __future__ import annotations

import re

from guard.tokens._bounds import WHITE_SPACE, WHITE_SPACE_STR

# Byte classes.
L, D, S, N, P, Y, Q = (ord(c) for c in "LDSNPYQ")
_LETTER = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"


def _class_table() -> bytes:
    table = bytearray(256)
    for b in range(256):
        if b in _LETTER:
            table[b] = L
        elif 0x30 <= b <= 0x39:
            table[b] = D
        elif b in b" \t\x0b\x0c":
            table[b] = S  # whitespace other than CR/LF
        elif b in b"\r\n":
            table[b] = N
        elif b < 0x80:
            table[b] = P  # punctuation, symbols, controls (\x1c-\x1f are not White_Space)
        elif b < 0xC0:
            table[b] = Y  # UTF-8 continuation byte
        else:
            table[b] = Q  # UTF-8 lead byte
    return bytes(table)


CLASS_TABLE = _class_table()


def classify(data: bytes | bytearray) -> bytes:
    """One class byte per byte of ``data`` (``L D S N P Y Q``)."""
    return bytes(data).translate(CLASS_TABLE)


def _char_before(data: bytes | bytearray, p: int) -> str:
    """The character that ends at byte ``p`` (``p`` is a character boundary)."""
    k = p - 1
    while k > 0 and data[k] & 0xC0 == 0x80:
        k -= 1
    return bytes(data[k:p]).decode("utf-8", "replace")


def _char_at(data: bytes | bytearray, p: int) -> str:
    lead = data[p]
    n = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
    return bytes(data[p : p + n]).decode("utf-8", "replace")


_S_RUN = re.compile(rb"S*")
_NOT_S = (b"L", b"D", b"P", b"N", b"Y", b"Q")


def _pair_codes(bigrams: tuple[bytes, ...]) -> tuple[bytes, bytes]:
    """Translation tables for counting class pairs (see ``pieces_lower_bound``)."""
    lefts = sorted({bg[0] for bg in bigrams})
    assert len(lefts) <= 8
    left = bytearray(256)
    right = bytearray(256)
    for bit, c in enumerate(lefts):
        left[c] = 1 << bit
    for bg in bigrams:
        right[bg[1]] |= 1 << lefts.index(bg[0])
    return bytes(left), bytes(right)


# Verifying a candidate is cheap, but adversarial text can hold many candidates that fail; after
# this many failures of one pattern in one search, that pattern is ignored (fewer splits is
# always sound).
_MAX_FAILED_CANDIDATES = 32


class SplitRules:
    """The safe-split rules of one pre-tokenizer regex."""

    name = "base"
    # (class pattern, offset of p from the match start); every candidate is checked with
    # is_split, so patterns only need to cover the rules, not to be exact.
    patterns: tuple[tuple[bytes, int], ...] = ()
    local_patterns: tuple[tuple[bytes, int], ...] = ()
    # Whether runs of one piece can be recognised (see single_piece).
    knows_pieces = False
    # How far (bytes) the local rules look around a split; periodic replication keeps this much
    # of the period on both sides.
    margin = 4
    # Class pairs ``cls[p-1] cls[p]`` at which a split always holds, whatever surrounds them.
    # Each such position ends a piece, and every piece has a token, so their number (plus one)
    # is a lower bound on the token count that ``bytes.count`` computes at C speed.
    split_bigrams: tuple[bytes, ...] = ()
    _codes: tuple[bytes, bytes] | None = None

    def pieces_lower_bound(self, cls: bytes | bytearray, a: int, b: int) -> int:
        """Splits that certainly fall inside ``[a, b)`` (at positions ``a+1 .. b-1``)."""
        if b - a < 2 or not self.split_bigrams:
            return 0
        if self._codes is None:
            self._codes = _pair_codes(self.split_bigrams)
        # One bit per left class; the right class carries the bits of the left classes it pairs
        # with. Shifted by a byte and ANDed as big integers, each split leaves exactly one bit.
        seg = bytes(cls[a:b])
        left = int.from_bytes(seg.translate(self._codes[0]), "little")
        right = int.from_bytes(seg.translate(self._codes[1]), "little")
        return (left & (right >> 8)).bit_count()

    def is_split(
        self,
        data: bytes | bytearray,
        cls: bytes | bytearray,
        p: int,
        ctx: int,
        end: int,
        *,
        local_only: bool = False,
    ) -> bool:
        """Whether ``p`` is a safe split of ``data[ctx:]``, looking only at ``data[ctx:end]``.

        ``local_only`` restricts to the rules whose context is at most ``p-4 .. p+4`` (used when
        a rule is replicated through a periodic region).
        """
        raise NotImplementedError

    def last_split(
        self, data: bytes | bytearray, cls: bytes | bytearray, lo: int, hi: int, ctx: int, end: int
    ) -> int:
        """The largest safe split ``p`` with ``lo <= p <= hi``, or -1."""
        best = -1
        for pat, off in self.patterns:
            start = max(lo - off, best - off + 1, 0)
            stop = min(hi - off + len(pat), end)
            k = cls.rfind(pat, start, stop)
            failed = 0
            while k >= 0:
                if self.is_split(data, cls, k + off, ctx, end):
                    best = k + off
                    break
                failed += 1
                if failed >= _MAX_FAILED_CANDIDATES:
                    break
                k = cls.rfind(pat, start, k + len(pat) - 1)
        return best

    def first_split(
        self,
        data: bytes | bytearray,
        cls: bytes | bytearray,
        lo: int,
        hi: int,
        ctx: int,
        end: int,
        *,
        local_only: bool = False,
    ) -> int:
        """The smallest safe split ``p`` with ``lo <= p <= hi``, or -1."""
        best = hi + 1
        for pat, off in self.local_patterns if local_only else self.patterns:
            start = max(lo - off, 0)
            k = cls.find(pat, start, min(best - off - 1 + len(pat), end))
            failed = 0
            while k >= 0:
                if self.is_split(data, cls, k + off, ctx, end, local_only=local_only):
                    best = k + off
                    break
                failed += 1
                if failed >= _MAX_FAILED_CANDIDATES:
                    break
                k = cls.find(pat, k + 1, min(best - off - 1 + len(pat), end))
        return best if best <= hi else -1

    def single_piece(self, data: bytes | bytearray, cls: bytes | bytearray, a: int, b: int) -> bool:
        """Whether ``data[a:b]``, tokenized alone, is one pre-tokenizer piece."""
        return False


class Cl100kRules(SplitRules):
    name = "cl100k"
    patterns = (
        *((b"L" + bytes([c]), 1) for c in (D, P, S, N)),  # A
        *((b"D" + bytes([c]), 1) for c in (L, P, S, N)),  # B
        (b"PS", 1),  # C (LS, DS are covered above)
        (b"YS", 1),
        *((b"N" + bytes([c]), 1) for c in (L, D, P, Q)),  # D
        (b"PPL", 2),  # I
        (b"PPD", 2),
        *((b"SS" + bytes([c]), 1) for c in (L, D, P, Q)),  # E
        (b"NS", 1),  # H
    )
    local_patterns = patterns[:16]
    knows_pieces = True
    split_bigrams = (
        *(b"L" + bytes([c]) for c in (D, P, S, N)),  # A
        *(b"D" + bytes([c]) for c in (L, P, S, N)),  # B
        b"PS",  # C
        *(b"N" + bytes([c]) for c in (L, D, P)),  # D
    )

    def is_split(
        self,
        data: bytes | bytearray,
        cls: bytes | bytearray,
        p: int,
        ctx: int,
        end: int,
        *,
        local_only: bool = False,
    ) -> bool:
        if p - 1 < ctx or p >= end:
            return False
        c1 = cls[p - 1]
        c0 = cls[p]
        if c1 == L:
            return c0 in (D, P, S, N)  # A
        if c1 == D:
            return c0 in (L, P, S, N)  # B
        if c0 == S:
            if c1 == P:
                return True  # C
            if c1 == Y:
                return _char_before(data, p) not in WHITE_SPACE  # C
            if local_only:
                return False
            if c1 == S:
                return self._rule_e(data, cls, p, ctx, end)
            if c1 == N:
                return self._rule_h(data, cls, p, end)
            return False
        if c1 == N:
            if c0 in (L, D, P):
                return True  # D
            return c0 == Q and _char_at(data, p) not in WHITE_SPACE
        if c1 == P and c0 in (L, D):
            return p - 2 >= ctx and cls[p - 2] == P  # I
        return False

    @staticmethod
    def _rule_e(
        data: bytes | bytearray, cls: bytes | bytearray, q: int, ctx: int, end: int
    ) -> bool:
        if q + 1 >= end:
            return False
        c2 = cls[q + 1]
        if c2 == Q:
            if _char_at(data, q + 1) in WHITE_SPACE:
                return False
        elif c2 not in (L, D, P):
            return False
        # The run of ASCII blanks that ends at q-1 must be the whole whitespace run (no CR/LF or
        # non-ASCII whitespace before it) or start at the context start.
        k = max(cls.rfind(c, ctx, q) for c in _NOT_S)
        s0 = k + 1 if k >= 0 else ctx
        if s0 == ctx:
            return True
        c = cls[s0 - 1]
        if c in (L, D, P):
            return True
        return c == Y and _char_before(data, s0) not in WHITE_SPACE

    @staticmethod
    def _rule_h(data: bytes | bytearray, cls: bytes | bytearray, s: int, end: int) -> bool:
        m = _S_RUN.match(cls, s, end)
        e = m.end() if m else s
        if e >= end:
            return False
        c = cls[e]
        if c in (L, D, P):
            return True
        return c == Q and _char_at(data, e) not in WHITE_SPACE

    def single_piece(self, data: bytes | bytearray, cls: bytes | bytearray, a: int, b: int) -> bool:
        if b - a < 2:
            return True
        seg = bytes(cls[a:b])
        rest = seg.translate(None, b"SN")
        if not rest:
            return True  # ASCII whitespace: `\s++$` takes it all
        if not rest.translate(None, b"YQ"):
            # Non-ASCII: one piece only if every character is White_Space.
            return not bytes(data[a:b]).decode("utf-8", "replace").strip(WHITE_SPACE_STR)
        first = seg[0]
        if seg.count(b"L", 1) == len(seg) - 1:
            # [^\r\n\p{L}\p{N}]?+\p{L}++ ; a leading ' could start a contraction instead.
            return first == L or (first in (P, S) and data[a] != 0x27)
        # ` ?[^\s\p{L}\p{N}]++[\r\n]*+`
        k = 1 if data[a] == 0x20 else 0
        body = seg[k:].rstrip(b"N")
        return len(body) > 0 and body.count(b"P") == len(body)


class Gpt2Rules(SplitRules):
    name = "gpt2"
    patterns = (
        *((b"L" + bytes([c]), 1) for c in (D, P, S, N)),  # A
        *((b"D" + bytes([c]), 1) for c in (L, P, S, N)),  # B
        (b"PS", 1),  # C'
        (b"PN", 1),
        (b"YS", 1),
        (b"YN", 1),
        (b"PPL", 2),  # I
        (b"PPD", 2),
    )
    local_patterns = patterns
    split_bigrams = (
        *(b"L" + bytes([c]) for c in (D, P, S, N)),  # A
        *(b"D" + bytes([c]) for c in (L, P, S, N)),  # B
        b"PS",  # C'
        b"PN",
    )

    def is_split(
        self,
        data: bytes | bytearray,
        cls: bytes | bytearray,
        p: int,
        ctx: int,
        end: int,
        *,
        local_only: bool = False,
    ) -> bool:
        if p - 1 < ctx or p >= end:
            return False
        c1 = cls[p - 1]
        c0 = cls[p]
        if c1 == L:
            return c0 in (D, P, S, N)  # A
        if c1 == D:
            return c0 in (L, P, S, N)  # B
        if c0 in (S, N):
            if c1 == P:
                return True  # C'
            return c1 == Y and _char_before(data, p) not in WHITE_SPACE
        if c1 == P and c0 in (L, D):
            return p - 2 >= ctx and cls[p - 2] == P  # I
        return False


CL100K_RULES = Cl100kRules()
GPT2_RULES = Gpt2Rules()

# Pre-tokenizer patterns the rules were derived for, exactly as the libraries spell them.
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
CL100K_PATTERN_OLD = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

_RULES_BY_PATTERN: dict[str, SplitRules] = {
    CL100K_PATTERN: CL100K_RULES,
    CL100K_PATTERN_OLD: CL100K_RULES,  # also Llama 3's pattern
    GPT2_PATTERN: GPT2_RULES,
}


def rules_for_pattern(pattern: str) -> SplitRules | None:
    """The split rules verified for ``pattern``, or None (then text is never split)."""
    return _RULES_BY_PATTERN.get(pattern)

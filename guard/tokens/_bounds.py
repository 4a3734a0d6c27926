"""Sound bounds on the token count of byte-level BPE, computed without tokenizing.

Byte-level BPE splits the UTF-8 bytes of a text into vocabulary tokens, each at least one byte
long, so ``tokens <= bytes``. For the lower bound, let ``M[b]`` be the length of the longest
vocabulary token that contains byte value ``b``. A token ``t`` contains only bytes with
``M[b] >= len(t)``, so ``1 = sum(1 / len(t) for each byte of t) >= sum(1 / M[b])`` and, summed
over all tokens, ``tokens >= sum(1 / M[b] for every byte of the text)``. This holds for any
split of the bytes into vocabulary tokens, whatever the merge order. It is much sharper than
``bytes / max_token_bytes``: 200 KB of ``a`` (``M = 42`` in cl100k) needs at least 4877 tokens,
while only spaces reach 128-byte tokens.

The sum is computed exactly in integers, with bytes grouped into a few tiers (each weighted by
the largest ``M`` of its tier, so the bound only gets weaker, never unsound).

Runs sharpen it (:meth:`ByteWeights.run_refinement`). A token that covers a byte inside a run of
``r`` copies of byte ``c`` either stays inside the run (at most ``min(r, Mrun[c])`` bytes, the
longest all-``c`` token) or crosses an end of the run, and then contains the pair of bytes there
(at most ``M2[pair]`` bytes, the longest token containing that pair). So each byte of the run may
weigh ``1 / max(min(r, Mrun[c]), M2[left pair], M2[right pair])``: a run of 100 spaces between
two tabs needs a token of its own, not 100/128 of one. This defeats "spaces with a sparse
sprinkle of tabs", which has no period and a weak per-byte bound.

Class changes bound random whitespace (:meth:`ByteWeights.transitions_bound`), which has neither
runs nor a period and makes one long pre-token piece that BPE handles slowly. Give each ASCII
whitespace byte its own class and every other byte one shared class, and let ``X`` count the
adjacent byte pairs of the text whose classes differ. Every such pair lies inside a token (at most
``T`` per token, ``T`` the most any vocabulary token holds: 9 in cl100k) or across a boundary
between two tokens (``tokens - 1`` of them), so ``tokens >= (X + 1) / (T + 1)``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable

# Unicode White_Space, the set that `\s` matches in the Rust `regex` crate used by tiktoken (and
# in Oniguruma for HF tokenizers). The property has been stable since Unicode 6.3; it is spelled
# out here so the pre-tokenizer split rules do not depend on Python's Unicode version.
WHITE_SPACE_STR = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680"
    + "".join(chr(c) for c in range(0x2000, 0x200B))
    + "\u2028\u2029\u202f\u205f\u3000"
)
WHITE_SPACE = frozenset(WHITE_SPACE_STR)


_ASCII_WHITESPACE = frozenset(b" \t\n\x0b\x0c\r")

# Bytes whose M is within this ratio share a tier; at most this many tiers (one counting pass
# each, so the bound costs a handful of C-speed passes over the text).
_TIER_RATIO = 0.88
_MAX_TIERS = 10
# Texts longer than this weigh their tiers in the order a sample of this many bytes shows.
_SAMPLE = 512
# Run refinement: bytes whose longest token is at least this long (space, -, /, *, =, ...), in
# runs of at least this many (shorter runs gain little and would cost a Python step each).
_RUN_HEAVY = 48
_RUN_MIN = 12


class ByteWeights:
    """The per-byte lower bound of one vocabulary (see the module docstring)."""

    def __init__(self, token_bytes: Iterable[bytes]) -> None:
        tokens = list(token_bytes)
        longest = [0] * 256
        for tok in tokens:
            n = len(tok)
            for b in set(tok):
                if n > longest[b]:
                    longest[b] = n
        if min(longest) == 0:
            raise ValueError("the vocabulary does not cover every byte; byte bounds do not hold")
        self.per_byte_max: tuple[int, ...] = tuple(longest)
        self.max_token_bytes: int = max(longest)

        # Tiers: walk the distinct M values from the largest down, open a new tier when the ratio
        # to the tier's maximum falls below _TIER_RATIO; the last tier takes everything left.
        values = sorted(set(longest), reverse=True)
        tier_max: list[int] = []
        for v in values:
            if not tier_max or (v < tier_max[-1] * _TIER_RATIO and len(tier_max) < _MAX_TIERS):
                tier_max.append(v)
        table = bytearray(256)
        for b, v in enumerate(longest):
            # The tier of b is the last one whose maximum is >= M[b].
            t = max(i for i, m in enumerate(tier_max) if m >= v)
            table[b] = t
        self._tier_max = tuple(tier_max)
        self.denominator = math.lcm(*tier_max)
        self._tier_num = tuple(self.denominator // m for m in tier_max)
        self._byte_num = tuple(self._tier_num[table[b]] for b in range(256))
        self._tokens = tokens
        self._pair_max: dict[int, int] = {}
        self._light = b""
        self._run_table: dict[int, tuple[bytes, bytes, re.Pattern[bytes], int, int]] | None = None
        members = [bytes(b for b in range(256) if table[b] == t) for t in range(len(tier_max))]
        # (bytes, numerator) of every tier that has bytes; a byte's tier index as one byte, for
        # sampling which tiers a text is made of.
        self._tiers = tuple(
            (members[t], self._tier_num[t]) for t in range(len(tier_max)) if members[t]
        )
        index = {t: i for i, t in enumerate(t for t in range(len(tier_max)) if members[t])}
        self._tier_of = bytes(index[table[b]] for b in range(256))
        self._tier_marks = tuple(bytes([i]) for i in range(len(self._tiers)))
        self._class_table = bytes(b if b in _ASCII_WHITESPACE else 0 for b in range(256))
        self.max_class_changes = max((self._class_changes(t) for t in tokens), default=0)

    def weight(self, data: bytes | bytearray) -> int:
        """``sum(1 / M[b])`` over ``data``, times :attr:`denominator` (an exact integer)."""
        # Deleting one tier at a time (translate runs at GB/s whatever the byte density, unlike
        # count), each pass on what the previous ones left, and the last tier's bytes are what
        # remains. Passes cost the bytes they read, so the tiers go most common first, as a
        # sample of the text shows: a text of one byte, or of letters with some punctuation,
        # is then read about once instead of once per tier.
        rest = bytes(data)
        tiers = self._tiers
        if len(rest) > _SAMPLE:
            sample = rest[:_SAMPLE].translate(self._tier_of)
            seen = [sample.count(mark) for mark in self._tier_marks]
            order = sorted(range(len(tiers)), key=seen.__getitem__, reverse=True)
            tiers = tuple(tiers[i] for i in order)
        total = 0
        for delete, num in tiers[:-1]:
            if not rest:
                return total
            kept = rest.translate(None, delete)
            total += (len(rest) - len(kept)) * num
            rest = kept
        return total + len(rest) * tiers[-1][1]

    def run_refinement(self, data: bytes) -> int:
        """Extra weight (same units as :meth:`weight`, >= 0) from runs of heavy bytes.

        ``weight(data) + run_refinement(data)`` is still a lower bound (module docstring); the
        per-run terms are rounded down.
        """
        runs = self._runs()
        total = 0
        n = len(data)
        present = data.translate(None, self._light)  # only the heavy bytes, at C speed
        if len(present) < _RUN_MIN:
            return 0
        for c, (probe, block, other, longest_run, old_num) in runs.items():
            if c not in present:
                continue
            s = data.find(probe)
            while s >= 0:
                # The run starts at s (an earlier copy of c would have matched first) and ends
                # at the first other byte: skip whole blocks with memcmp, then search.
                e = s + len(probe)
                while data.startswith(block, e):
                    e += len(block)
                m = other.search(data, e)
                e = m.start() if m else n
                r = e - s
                denom = min(r, longest_run)
                if s:
                    denom = max(denom, self._pair_max.get((data[s - 1] << 8) | c, 0))
                if e < n:
                    denom = max(denom, self._pair_max.get((c << 8) | data[e], 0))
                extra = (r * self.denominator) // denom - r * old_num
                if extra > 0:
                    total += extra
                s = data.find(probe, e)
        return total

    def _runs(self) -> dict[int, tuple[bytes, bytes, re.Pattern[bytes], int, int]]:
        # Built on first use: the pair table costs a pass over the vocabulary.
        if self._run_table is not None:
            return self._run_table
        heavy = {b for b in range(256) if self.per_byte_max[b] >= _RUN_HEAVY}
        pair_max: dict[int, int] = {}
        run_max = dict.fromkeys(heavy, 1)
        for tok in self._tokens:
            n = len(tok)
            if n < 2 or heavy.isdisjoint(tok):
                continue
            if tok.count(tok[0]) == n:
                run_max[tok[0]] = max(run_max[tok[0]], n)
            for k in range(n - 1):
                x, y = tok[k], tok[k + 1]
                if x in heavy or y in heavy:
                    key = (x << 8) | y
                    if pair_max.get(key, 0) < n:
                        pair_max[key] = n
        self._pair_max = pair_max
        self._light = bytes(b for b in range(256) if b not in heavy)
        table = {}
        for c in sorted(heavy):
            one = bytes([c])
            other = re.compile(b"[^" + re.escape(one) + b"]")
            table[c] = (one * _RUN_MIN, one * 1024, other, run_max[c], self._byte_num[c])
        self._run_table = table
        return table

    def _class_changes(self, data: bytes | bytearray) -> int:
        """Adjacent pairs of ``data`` whose classes differ, counted at C speed (no Python loop)."""
        if len(data) < 2:
            return 0
        classes = bytes(data).translate(self._class_table)
        head = int.from_bytes(classes[:-1], "little")
        tail = int.from_bytes(classes[1:], "little")
        diff = (head ^ tail).to_bytes(len(classes) - 1, "little")
        return len(diff) - diff.count(0)

    def raised_bound(self, bound: int, data: bytes | bytearray, enough: int | None) -> int:
        """``bound`` (from :meth:`weight`) raised by the class-change bound, unless it already
        exceeds ``enough``: random whitespace is one long piece with no runs or period, slow
        to tokenize, which only class changes bound well."""
        if enough is not None and bound > enough:
            return bound
        return max(bound, self.transitions_bound(data))

    def transitions_bound(self, data: bytes | bytearray) -> int:
        """A token lower bound from class changes (see the module docstring)."""
        if not data:
            return 0
        return -(-(self._class_changes(data) + 1) // (self.max_class_changes + 1))

    def tokens(self, weight: int) -> int:
        """The token lower bound for a weight from :meth:`weight` (the ceiling of the sum)."""
        return -(-weight // self.denominator)

    def lower_bound(self, data: bytes | bytearray) -> int:
        return self.tokens(self.weight(data))

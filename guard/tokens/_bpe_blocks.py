"""Counting one long, repetitive BPE piece from a few short BPE runs.

tiktoken's BPE merges, again and again, the adjacent pair whose concatenation has the lowest
rank (ties: the leftmost). For two byte strings ``X`` and ``Y`` say the pair is *separable* when
``BPE(X + Y)`` has a token boundary at ``len(X)``: then no merge ever crossed that point (a merged
token is never split again), and ``BPE(X + Y) == BPE(X) + BPE(Y)``.

Lemma. If a string is cut into blocks ``X1 .. Xk`` and every *adjacent pair* is separable, then
``BPE(X1 + .. + Xk) == BPE(X1) + .. + BPE(Xk)``.

Proof. Suppose some merge crosses a block boundary and take the first one, between ``Xj`` and
``Xj+1``. Until then every block evolved on its own. Restricted to the pairs inside ``Xj``, inside
``Xj+1`` and the one across them, the global process always merges the member of that set with
the lowest (rank, position): merges elsewhere do not change these pairs, and any other member is
beaten by it. That is exactly what BPE on ``Xj + Xj+1`` alone does, so both go through the same
states and BPE on ``Xj + Xj+1`` makes the same crossing merge, contradicting separability.

So a piece ``head + u^n + tail`` (``u`` repeated, 256 KB of spaces, ``-`` or ``ab``) is counted as
``|BPE(X1)| + m * |BPE(B)| + |BPE(Xl)|`` with ``X1 = head + B``, middle blocks ``B = u^k`` and
``Xl = B + rest + tail``, after checking the three pairs ``(X1, B)``, ``(B, B)``, ``(B, Xl)`` —
a few hundred bytes of BPE instead of the whole piece. When a check fails the caller tokenizes
the piece whole, so the result is always exact.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from itertools import accumulate

from guard.tokens._periodic import periodic_core

# Blocks hold a whole number of periods and at least this many bytes (cl100k's longest token is
# 128 bytes; a pair of blocks is then never itself a single token, which tiktoken would look up
# directly instead of running BPE).
_BLOCK_BYTES = 128
_MIN_CORE = 8 * _BLOCK_BYTES
_CACHE_MAX_KEY = 4096
_CACHE_ENTRIES = 1024


class PieceBlocks:
    """Counts long periodic pieces with the block lemma; ``None`` when it does not apply."""

    def __init__(self, piece_lengths: Callable[[bytes], list[int]]) -> None:
        # piece_lengths(piece) -> byte length of each token of plain BPE on that one piece.
        self._piece_lengths = piece_lengths
        # Pair checks repeat across requests (the same run of spaces); small keys are cached.
        self._cache: dict[tuple[bytes, bytes], tuple[int, int] | None] = {}

    def separable(self, x: bytes, y: bytes) -> tuple[tuple[int, int] | None, int]:
        """``((|BPE(x)|, |BPE(y)|) or None if not separable, bytes tokenized)``."""
        small = len(x) + len(y) <= _CACHE_MAX_KEY
        if small and (x, y) in self._cache:
            return self._cache[(x, y)], 0
        lens = self._piece_lengths(x + y)
        acc = list(accumulate(lens))
        k = bisect_left(acc, len(x))
        found = (k + 1, len(lens) - k - 1) if k < len(acc) and acc[k] == len(x) else None
        if small:
            if len(self._cache) >= _CACHE_ENTRIES:
                self._cache.clear()
            self._cache[(x, y)] = found
        return found, len(x) + len(y)

    def count(self, piece: bytes) -> tuple[int, int] | None:
        """``(BPE token count of piece, bytes tokenized to find it)``, or None.

        ``piece`` must be one pre-tokenizer piece, long enough not to be a token itself.
        """
        if len(piece) < _MIN_CORE:
            return None
        core = periodic_core(piece, _MIN_CORE)
        if core is None:
            return None
        d, start, stop = core
        spent = 0
        base = d * -(-_BLOCK_BYTES // d)
        for size in (base, 2 * base, 4 * base):
            n_blocks = (stop - start) // size
            if n_blocks < 3:
                return None
            block = piece[start + size : start + 2 * size]
            if n_blocks >= 4:
                # Middle blocks must be separable from each other whatever the ends are.
                mm, t = self.separable(block, block)
                spent += t
                if mm is None:
                    continue
            for head_blocks in (1, 2):
                left, t = self.separable(piece[: start + head_blocks * size], block)
                spent += t
                if left is None:
                    continue
                for tail_blocks in (1, 2):
                    middle = n_blocks - head_blocks - tail_blocks
                    if middle < 1:
                        continue
                    right, t = self.separable(
                        block, piece[start + (n_blocks - tail_blocks) * size :]
                    )
                    spent += t
                    if right is None:
                        continue
                    return left[0] + middle * left[1] + right[1], spent
        return None

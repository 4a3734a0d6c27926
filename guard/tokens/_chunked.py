"""Counting tokens chunk by chunk with an early stop.

The text (sanitized UTF-8 bytes) is cut at safe splits (:mod:`guard.tokens._pretokenize`) into chunks of
a few KB, each tokenized alone; the sum is the exact count. Between chunks the count is compared
with the limit, and with the limit minus a lower bound of what is left, so an over-limit prompt
stops after a prefix. Two shortcuts keep adversarial repetition cheap, both exact:

- a periodic stretch with a safe split in each period is ``head + k * unit``: the unit is
  tokenized once and multiplied;
- a long chunk that is a single pre-tokenizer piece (256 KB of spaces, a run of ``-``) is counted
  with the block lemma of :mod:`guard.tokens._bpe_blocks`.

Everything else goes to the tokenizer, so the result never depends on a heuristic.
"""

from __future__ import annotations

from dataclasses import dataclass

from guard.tokens._backends import Backend
from guard.tokens._bounds import ByteWeights
from guard.tokens._bpe_blocks import PieceBlocks
from guard.tokens._periodic import period_from
from guard.tokens._pretokenize import classify

# Target chunk size: large enough that the tokenizer call dominates the bookkeeping, small enough
# that the early stop overshoots the limit by little.
CHUNK = 4096
# Shortest stretch worth the periodic shortcut, and the size from which a chunk is checked for
# being one long piece.
PERIODIC_MIN = 256
LONG_CHUNK = 1024
# Forward search for the next split: windows growing by this factor, so finding a split costs
# about twice the distance to it.
_SEARCH_FIRST = 16384


@dataclass
class ChunkedCount:
    """A chunked count: ``tokens`` (exact, or a lower bound once over the limit), whether it is
    ``exact``, whether it is ``within`` the limit, and how many bytes went to the tokenizer."""

    tokens: int
    exact: bool
    within: bool
    tokenized_bytes: int


class ChunkedCounter:
    """Counts tokens chunk by chunk for one tokenizer backend (see the module docstring)."""

    def __init__(self, backend: Backend, weights: ByteWeights | None) -> None:
        self.backend = backend
        self.rules = backend.rules
        self.weights = weights
        self.blocks = (
            PieceBlocks(backend.piece_lengths)
            if backend.supports_pieces and self.rules is not None and self.rules.knows_pieces
            else None
        )

    def count(
        self,
        data: bytes,
        limit: int | None,
        exact: bool,
        weight: int | None,
        cls: bytes | None = None,
        splits: int | None = None,
    ) -> ChunkedCount:
        """Count ``data``; stop once the count is known to exceed ``limit``.

        ``weight`` is the :class:`ByteWeights` weight of ``data`` (None: no byte bounds);
        ``cls`` its classes when already computed, ``splits`` a lower bound on its certain splits
        (``SplitRules.pieces_lower_bound``; None: not used). When ``exact`` is false, also stop
        once the rest provably fits (byte upper bound).
        """
        n = len(data)
        rules = self.rules
        if rules is None:
            c = self.backend.encode_count(data.decode("utf-8"))
            return ChunkedCount(c, True, limit is None or c <= limit, n)
        weights = self.weights
        if cls is None:
            cls = classify(data)
        # Lower bounds of the rest (the text from i): its weight, and the splits inside it.
        w_rest = weight if weights is not None and limit is not None else None
        # (A partial `splits` only weakens the bound: subtracting what was counted keeps it low.)
        s_rest = splits if limit is not None and rules.split_bigrams else None
        tokenized = 0
        count = 0
        i = 0
        while i < n:
            if limit is not None:
                bound = count
                if w_rest is not None and weights is not None:
                    bound = max(bound, count + weights.tokens(w_rest))
                if s_rest is not None:
                    bound = max(bound, count + s_rest + 1)
                if bound > limit:
                    return ChunkedCount(bound, False, False, tokenized)
                if not exact and weights is not None and count + (n - i) <= limit:
                    # Byte upper bound on the rest: the whole prompt fits.
                    return ChunkedCount(count + n - i, False, True, tokenized)
            step = self._periodic_step(data, cls, i, n) if n - i >= PERIODIC_MIN else None
            if step is None:
                j = self._chunk_end(data, cls, i, n)
                c, t = self._count_chunk(data, cls, i, j)
                unit = None
            else:
                j, c, t, unit = step
            tokenized += t
            count += c
            if limit is not None and count > limit:
                return ChunkedCount(count, False, False, tokenized)
            if j < n and (w_rest is not None or s_rest is not None):
                # The rest shrinks by what was just counted.
                if unit is None:
                    if w_rest is not None and weights is not None:
                        w_rest -= weights.weight(data[i:j])
                    if s_rest is not None:
                        s_rest -= rules.pieces_lower_bound(cls, i, j + 1)
                else:
                    p, d, k = unit
                    if w_rest is not None and weights is not None:
                        w_rest -= weights.weight(data[i:p]) + k * weights.weight(data[p : p + d])
                    if s_rest is not None:
                        s_rest -= rules.pieces_lower_bound(cls, i, p + 1)
                        s_rest -= k * rules.pieces_lower_bound(cls, p, p + d + 1)
            i = j
        return ChunkedCount(count, True, limit is None or count <= limit, tokenized)

    def _chunk_end(self, data: bytes, cls: bytes, i: int, n: int) -> int:
        """The end of the next chunk: the last split before ``i + CHUNK``, else the next one."""
        target = i + CHUNK
        if target >= n:
            return n
        assert self.rules is not None
        p = self.rules.last_split(data, cls, i + 1, target, i, n)
        if p > i:
            return p
        return self.next_split(data, cls, target, n, i)

    def next_split(self, data: bytes, cls: bytes, lo: int, n: int, ctx: int) -> int:
        """The first split at or after ``lo`` (``n`` if none)."""
        assert self.rules is not None
        width = _SEARCH_FIRST
        while lo < n:
            hi = min(n, lo + width)
            p = self.rules.first_split(data, cls, lo, hi, ctx, n)
            if p >= 0:
                return p
            if hi >= n:
                break
            # The next window overlaps by a few bytes so patterns across the edge are seen.
            lo = hi - 4
            width *= 4
        return n

    def _count_chunk(self, data: bytes, cls: bytes, a: int, b: int) -> tuple[int, int]:
        """``(tokens, bytes given to the tokenizer)`` of the chunk ``data[a:b]``."""
        if b - a >= LONG_CHUNK and self.blocks is not None:
            assert self.rules is not None
            if self.rules.single_piece(data, cls, a, b):
                counted = self.blocks.count(data[a:b])
                if counted is not None:
                    return counted
        return self.backend.encode_count(data[a:b].decode("utf-8")), b - a

    def _periodic_step(
        self, data: bytes, cls: bytes, i: int, n: int
    ) -> tuple[int, int, int, tuple[int, int, int] | None] | None:
        """``(end, tokens, bytes tokenized, repeat)`` for a periodic stretch at ``i``, or None.

        ``repeat`` is ``(p, d, k)`` when the stretch was counted as ``data[i:p]`` then ``k``
        copies of ``data[p:p+d]``.
        """
        found = period_from(data, i, n, PERIODIC_MIN)
        if found is None:
            return None
        d, stop = found
        rules = self.rules
        assert rules is not None
        margin = rules.margin
        # A split in the first period (with the next period as its context) repeats in every
        # period: the rules only look at `margin` bytes around it, all inside the stretch.
        p = rules.first_split(data, cls, i + 1, i + d, i, stop, local_only=True)
        if (
            p >= 0
            and p + d - margin >= i
            and rules.is_split(data, cls, p + d, p, stop, local_only=True)
        ):
            k = (stop - margin - p) // d
            if k >= 2:
                head, t_head = self._count_chunk(data, cls, i, p)
                unit, t_unit = self._count_chunk(data, cls, p, p + d)
                return p + k * d, head + k * unit, t_head + t_unit, (p, d, k)
        # No split inside the stretch: count up to the first split after it, as one chunk
        # (usually a single long piece for the block lemma).
        j = self.next_split(data, cls, max(i + 1, stop - margin), n, i)
        if j - i < LONG_CHUNK:
            return None
        c, t = self._count_chunk(data, cls, i, j)
        return j, c, t, None

"""Delta debugging (Zeller's ddmin) over bytes, bounded in tests and time.

``ddmin(data, still_fails)`` returns a smaller input for which ``still_fails`` still holds:
it removes chunks at decreasing granularity, then single bytes, keeping every removal after
which the predicate (the oracle's "same cause") still holds. It stops early at ``max_tests``
predicate calls or at ``deadline_s`` and returns the best input found so far; the result is
always one for which the predicate held (or ``data`` itself).
"""

from __future__ import annotations

from collections.abc import Callable

from fuzz.minimize._budget import MinimiseBudget, MinimiseStats

__all__ = ["ddmin"]


def ddmin(
    data: bytes,
    still_fails: Callable[[bytes], bool],
    *,
    max_tests: int = 2000,
    deadline_s: float | None = None,
    stats: MinimiseStats | None = None,
) -> bytes:
    """The smallest input found for which ``still_fails`` holds (1-minimal when not cut short:
    removing any single byte makes it pass)."""
    stats = stats if stats is not None else MinimiseStats()
    budget = MinimiseBudget(max_tests, deadline_s, stats)
    tried: set[bytes] = set()

    def test(candidate: bytes) -> bool:
        if candidate in tried:
            return False
        tried.add(candidate)
        stats.tests += 1
        return still_fails(candidate)

    current = data
    n = 2
    while len(current) >= 2:
        chunk = max(1, len(current) // n)
        starts = range(0, len(current), chunk)
        reduced = False
        # Try each complement (the input without one chunk); subsets are subsumed at n = 2.
        for start in starts:
            if budget.spent():
                return current
            candidate = current[:start] + current[start + chunk :]
            if candidate and test(candidate):
                current = candidate
                n = max(n - 1, 2)
                reduced = True
                break
        if reduced:
            continue
        if chunk == 1:
            break
        n = min(len(current), n * 2)
    if len(current) == 1 and not budget.spent() and test(b""):
        current = b""
    stats.complete = True
    return current

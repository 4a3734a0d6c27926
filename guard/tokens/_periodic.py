"""Finding long periodic stretches (``xyzxyzxyz...``) with C-speed searches and comparisons.

Repetition is what makes adversarial prompts cheap to send and expensive to tokenize (one huge
run of spaces, a template expanded a thousand times). A period is found by searching where a
short probe recurs; its extent by comparing the text with itself shifted by the period
(exponential then binary search, each step one ``startswith``).
"""

from __future__ import annotations

MAX_PERIOD = 2048


def match_forward(data: bytes, a: int, b: int, limit: int) -> int:
    """The largest ``k <= limit`` with ``data[a:a+k] == data[b:b+k]``."""
    limit = min(limit, len(data) - a, len(data) - b)
    if limit <= 0:
        return 0
    lo, k = 0, 64
    while k < limit and data.startswith(data[b : b + k], a):
        lo, k = k, k * 4
    hi = min(k, limit)
    if data.startswith(data[b : b + hi], a):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if data.startswith(data[b : b + mid], a):
            lo = mid
        else:
            hi = mid
    return lo


def match_backward(data: bytes, a: int, b: int, limit: int) -> int:
    """The largest ``t <= limit`` with ``data[a-t:a] == data[b-t:b]``."""
    limit = min(limit, a, b)
    if limit <= 0:
        return 0
    lo, k = 0, 64
    while k < limit and data.endswith(data[b - k : b], 0, a):
        lo, k = k, k * 4
    hi = min(k, limit)
    if data.endswith(data[b - hi : b], 0, a):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if data.endswith(data[b - mid : b], 0, a):
            lo = mid
        else:
            hi = mid
    return lo


def _period_at(data: bytes, at: int, end: int) -> tuple[int, int] | None:
    """``(d, right)``: ``data[x] == data[x+d]`` for ``at <= x < at + right``, or None.

    The probe starts short and grows past any spurious short repetition, so with a long enough
    stretch the period found is the smallest one.
    """
    k = 16
    for _ in range(4):
        if at + k > end:
            return None
        probe = data[at : at + k]
        j = data.find(probe, at + 1, min(end, at + 1 + MAX_PERIOD + k))
        if j < 0:
            return None
        d = j - at
        right = match_forward(data, at, j, end - j)
        if right >= 4 * d:
            return d, right
        k = right + d + 16
        if k > MAX_PERIOD:
            return None
    return None


def period_from(data: bytes, at: int, end: int, min_len: int) -> tuple[int, int] | None:
    """A periodic stretch starting at ``at``: ``(d, stop)`` where ``data[at:stop]`` has period
    ``d`` and is at least ``min_len`` bytes and 4 periods long; else None."""
    found = _period_at(data, at, end)
    if found is None:
        return None
    d, right = found
    stop = at + d + right
    if stop - at < max(min_len, 4 * d):
        return None
    return d, stop


def periodic_core(data: bytes, min_len: int) -> tuple[int, int, int] | None:
    """The periodic stretch through the middle of ``data``: ``(d, start, stop)``, or None."""
    n = len(data)
    mid = n // 2
    found = _period_at(data, mid, n)
    if found is None:
        return None
    d, right = found
    left = match_backward(data, mid, mid + d, mid)
    start, stop = mid - left, mid + d + right
    if stop - start < max(min_len, 8 * d):
        return None
    return d, start, stop

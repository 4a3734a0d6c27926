"""What every minimiser is given and reports: a budget of predicate calls and time, and stats."""

from __future__ import annotations

import time

__all__ = ["MinimiseBudget", "MinimiseStats"]


class MinimiseStats:
    """``tests``: predicate calls made; ``complete``: the minimiser ran to its end (the result
    is as small as it can make it) rather than stopping at its budget."""

    __slots__ = ("complete", "tests")

    def __init__(self) -> None:
        self.tests = 0
        self.complete = False


class MinimiseBudget:
    """At most ``max_tests`` predicate calls and ``deadline_s`` seconds (None: no deadline),
    counted in ``stats``."""

    __slots__ = ("end", "max_tests", "stats")

    def __init__(self, max_tests: int, deadline_s: float | None, stats: MinimiseStats) -> None:
        self.max_tests = max_tests
        self.end = None if deadline_s is None else time.monotonic() + deadline_s
        self.stats = stats

    def spent(self) -> bool:
        """No predicate call may be made any more."""
        return self.stats.tests >= self.max_tests or (
            self.end is not None and time.monotonic() > self.end
        )

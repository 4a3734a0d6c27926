"""A budget charged as work happens: depth, expansion bytes, tokens, steps and a deadline.

Crossing any limit raises one typed error (:class:`~guard.errors.LimitExceeded`). A limit of
``None`` means unlimited, which is how the reference scheduler's vulnerable profile runs the same
code without protection.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from guard.errors import LimitExceeded


class IncrementalCount(Protocol):
    """Counts the tokens of text fed in pieces; raises once the count crosses its limit."""

    def feed(self, text: str) -> None: ...

    def finish(self) -> int: ...


@dataclass(frozen=True)
class Limits:
    """The limits of one unit of work. ``None`` is unlimited."""

    max_depth: int | None = None
    max_tokens: int | None = None
    max_expansion_bytes: int | None = None
    max_steps: int | None = None
    deadline_s: float | None = None

    @classmethod
    def unlimited(cls) -> Limits:
        return cls()


# Checking the clock on every step would dominate cheap steps; every 256th is enough for a
# deadline measured in milliseconds.
_DEADLINE_CHECK_EVERY = 256


class Budget:
    """Charges work against :class:`Limits` and raises :class:`LimitExceeded` when one is crossed.

    ``tokens`` is an incremental token count (see :mod:`guard.tokens._counter`) bound to ``max_tokens``;
    when absent, text is charged as bytes only.
    """

    def __init__(
        self,
        limits: Limits,
        tokens: IncrementalCount | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limits = limits
        self._tokens = tokens
        self._clock = clock
        self._deadline = None if limits.deadline_s is None else clock() + limits.deadline_s
        self.bytes_used = 0
        self.steps_used = 0
        self.max_depth_seen = 0

    def check_depth(self, depth: int) -> None:
        """Record that work reached nesting ``depth``; raise if it is past the limit."""
        if depth > self.max_depth_seen:
            self.max_depth_seen = depth
        limit = self.limits.max_depth
        if limit is not None and depth > limit:
            raise LimitExceeded(
                "template_depth_exceeded",
                f"template nesting depth {depth} exceeds the limit of {limit}",
            )

    def charge_text(self, text: str) -> None:
        """Charge emitted text: its UTF-8 bytes, and its tokens when a counter is attached."""
        if not text:
            return
        limit = self.limits.max_expansion_bytes
        if limit is not None:
            # len(text) is a lower bound on the UTF-8 length: check it first, so a huge piece
            # is refused without encoding it.
            if self.bytes_used + len(text) > limit:
                self._raise_bytes(limit)
            self.bytes_used += len(text.encode("utf-8", "surrogatepass"))
            if self.bytes_used > limit:
                self._raise_bytes(limit)
        else:
            self.bytes_used += len(text)
        if self._tokens is not None:
            self._tokens.feed(text)

    def charge_steps(self, n: int = 1) -> None:
        """Charge ``n`` units of work (loop iterations, expansion steps)."""
        before = self.steps_used
        self.steps_used = before + n
        limit = self.limits.max_steps
        if limit is not None and self.steps_used > limit:
            raise LimitExceeded(
                "step_budget_exceeded",
                f"the work exceeded its budget of {limit} steps",
            )
        if self._deadline is not None and (
            n >= _DEADLINE_CHECK_EVERY
            or before // _DEADLINE_CHECK_EVERY != self.steps_used // _DEADLINE_CHECK_EVERY
        ):
            self.check_deadline()

    def check_deadline(self) -> None:
        if self._deadline is not None and self._clock() > self._deadline:
            raise LimitExceeded(
                "deadline_exceeded",
                f"the work exceeded its deadline of {self.limits.deadline_s * 1000:.0f} ms"
                if self.limits.deadline_s is not None
                else "the work exceeded its deadline",
                status=408,
            )

    def tokens_used(self) -> int:
        """The exact token count of the text charged so far (0 without a counter)."""
        return 0 if self._tokens is None else self._tokens.finish()

    def _raise_bytes(self, limit: int) -> None:
        raise LimitExceeded(
            "expansion_bytes_exceeded",
            f"the expansion exceeds the limit of {limit} bytes",
        )
